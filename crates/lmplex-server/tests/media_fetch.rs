//! Image URLs fetched against a loopback HTTP server (`lmplex_server::media`): a listed host's
//! image arrives whole, and every way a fetch can go wrong (a status, a body past the cap, a
//! stall, a redirect off the list or in a loop) is an error that names the host and the reason,
//! in time, never the URL's query.

use lmplex_server::media::{MediaFetcher, MediaPolicy};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const IMAGE: &[u8] = b"\x89PNG not really, but bytes";
const CAP: usize = 1000;

/// Answers one connection by its request's path (see the match).
async fn answer(mut io: TcpStream, port: u16) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match io.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split(' ').nth(1).unwrap_or("/").split('?').next().unwrap_or("/").to_string();
    let redirect = |to: String| format!("HTTP/1.1 302 Found\r\nlocation: {to}\r\ncontent-length: 0\r\n\r\n");
    let reply = match path.as_str() {
        "/ok" => format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", IMAGE.len()),
        "/slow" => {
            tokio::time::sleep(Duration::from_millis(300)).await;
            format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", IMAGE.len())
        }
        "/missing" => "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".into(),
        "/declared" => format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", CAP + 1),
        "/big" => {
            // No length: the body runs to the connection's close, one byte past the cap.
            let _ = io.write_all(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n").await;
            for _ in 0..=CAP / 100 {
                if io.write_all(&[7u8; 100]).await.is_err() {
                    return;
                }
            }
            return;
        }
        "/stall" => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            return;
        }
        "/redirect-in" => redirect("/ok".into()),
        "/redirect-out" => redirect(format!("http://localhost:{port}/ok?token=sekrit")),
        "/redirect-ftp" => redirect("ftp://127.0.0.1/ok".into()),
        "/loop" => redirect("/loop".into()),
        _ => "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n".into(),
    };
    let _ = io.write_all(reply.as_bytes()).await;
    if reply.starts_with("HTTP/1.1 200") && path != "/declared" {
        let _ = io.write_all(IMAGE).await;
    }
}

/// A loopback HTTP server on a free port; its base URL.
async fn server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((io, _)) = listener.accept().await {
            tokio::spawn(answer(io, port));
        }
    });
    format!("http://127.0.0.1:{port}")
}

fn fetcher(timeout_s: f64) -> MediaFetcher {
    let mut policy = MediaPolicy::new(&["127.0.0.1".into()], timeout_s).unwrap();
    policy.max_bytes = CAP;
    MediaFetcher::new(policy).unwrap()
}

#[tokio::test]
async fn a_listed_host_is_fetched_and_each_failure_is_named() {
    let base = server().await;
    let media = fetcher(0.5);
    assert_eq!(&*media.fetch(&format!("{base}/ok?token=sekrit")).await.unwrap(), IMAGE);
    assert_eq!(&*media.fetch(&format!("{base}/redirect-in")).await.unwrap(), IMAGE, "a redirect on a listed host");
    for (path, want) in [
        ("/missing", "HTTP 404 Not Found"),
        ("/declared", "larger than 1000 bytes"),
        ("/big", "larger than 1000 bytes"),
        ("/redirect-out", "redirects to 'localhost', which is not in allowed_media_domains"),
        ("/redirect-ftp", "scheme 'ftp'"),
        ("/loop", "more than 10 redirects"),
        ("/stall", "longer than 0.5 s (media_fetch_timeout_s)"),
    ] {
        let start = Instant::now();
        let e = media.fetch(&format!("{base}{path}?token=sekrit")).await.unwrap_err();
        assert!(e.contains(want) && e.contains("'127.0.0.1'"), "{path}: {e}");
        assert!(!e.contains("sekrit") && !e.contains(path), "{path}: the error shows the URL: {e}");
        assert!(start.elapsed() < Duration::from_secs(3), "{path} took {:?}", start.elapsed());
    }
}

#[tokio::test]
async fn several_images_are_fetched_at_once_and_the_same_url_once() {
    let base = server().await;
    let media = fetcher(5.0);
    let urls: Vec<String> = (0..4).map(|i| format!("{base}/slow?i={i}")).collect();
    let mut asked: Vec<&str> = urls.iter().map(String::as_str).collect();
    asked.push(&urls[0]);
    let start = Instant::now();
    let fetched = media.fetch_all(&asked).await.unwrap();
    let took = start.elapsed();
    assert!(took < Duration::from_millis(1000), "4 fetches of 300 ms each took {took:?}: not concurrent");
    assert!(urls.iter().all(|u| fetched.get(u).is_some_and(|b| &*b == IMAGE)));
    let many: Vec<String> = (0..9).map(|i| format!("{base}/ok?i={i}")).collect();
    let e = media.fetch_all(&many.iter().map(String::as_str).collect::<Vec<_>>()).await.unwrap_err();
    assert!(e.contains("at most 8 image URLs, got 9"), "{e}");
    let e = media.fetch_all(&[&urls[1], &format!("{base}/missing")]).await.unwrap_err();
    assert!(e.contains("404"), "one failure fails the request: {e}");
}
