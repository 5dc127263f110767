//! Tests of the SQLite usage store: files shared by stores, leases, refusals, foreign files and
//! servers opening a new file at once.

use super::*;

fn cfg() -> TenantConfig {
    TenantConfig { requests_per_minute: Some(3), max_cost_per_day: Some(10.0), ..TenantConfig::new("t") }
}

#[test]
fn two_stores_on_one_file_share_the_windows_and_a_reopen_keeps_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage.sqlite");
    let (a, b) = (SqliteStore::open(&path, 30.0, 60.0).unwrap(), SqliteStore::open(&path, 30.0, 60.0).unwrap());
    let (c, ask, now) = (cfg(), Ask { tokens: 10, cost: 1.0 }, quota::now_s());
    let (id, _) = a.admit(&c, ask, now).unwrap().unwrap();
    b.admit(&c, ask, now).unwrap().unwrap();
    a.settle(
        &c,
        id,
        Usage {
            prompt_tokens: 4,
            completion_tokens: 2,
            cached_tokens: 0,
            reasoning_tokens: 0,
            cache_created_tokens: 0,
        },
        0.25,
        now,
    )
    .unwrap();
    drop((a, b));
    let again = SqliteStore::open(&path, 30.0, 60.0).unwrap();
    again.admit(&c, ask, now).unwrap().unwrap();
    assert!(again.admit(&c, ask, now).unwrap().is_err(), "3 requests per minute across the three");
    let u = again.usage(&c, now).unwrap();
    assert_eq!((u.requests, u.prompt_tokens, u.completion_tokens, u.in_flight), (3, 4, 2, 2));
    assert!((u.cost - 0.25).abs() < 1e-12 && (u.cost_today - 2.25).abs() < 1e-12, "{u:?}");
}

#[test]
fn an_expired_lease_is_charged_once_at_its_reservation() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("usage.sqlite");
    let (c, ask, now) = (cfg(), Ask { tokens: 10, cost: 1.5 }, quota::now_s());
    let dead = SqliteStore::open(&path, 30.0, 60.0).unwrap();
    let (id, _) = dead.admit(&c, ask, now).unwrap().unwrap();
    let live = SqliteStore::open(&path, 30.0, 60.0).unwrap();
    // 31 s later its lease has passed: the next look charges the reservation.
    let u = live.usage(&c, now + 31.0).unwrap();
    assert_eq!(u.in_flight, 0);
    assert!((u.cost - 1.5).abs() < 1e-12 && (u.cost_today - 1.5).abs() < 1e-12, "{u:?}");
    // The owner settling late adds nothing.
    dead.settle(
        &c,
        id,
        Usage {
            prompt_tokens: 1,
            completion_tokens: 1,
            cached_tokens: 0,
            reasoning_tokens: 0,
            cache_created_tokens: 0,
        },
        0.1,
        now + 32.0,
    )
    .unwrap();
    let u = live.usage(&c, now + 33.0).unwrap();
    assert!((u.cost - 1.5).abs() < 1e-12 && u.prompt_tokens == 0, "{u:?}");
}

#[test]
fn a_token_refusal_waits_for_the_entries_that_free_enough() {
    let dir = tempfile::tempdir().unwrap();
    let s = SqliteStore::open(&dir.path().join("usage.sqlite"), 30.0, 60.0).unwrap();
    let c = TenantConfig { tokens_per_minute: Some(100), quota_window_s: 60.0, ..TenantConfig::new("t") };
    let now = quota::now_s();
    s.admit(&c, Ask { tokens: 30, cost: 0.0 }, now - 50.0).unwrap().unwrap();
    s.admit(&c, Ask { tokens: 50, cost: 0.0 }, now - 20.0).unwrap().unwrap();
    // 60 more need 40 freed: the first entry (30) is not enough, the second frees it at now + 40.
    let refused = s.admit(&c, Ask { tokens: 60, cost: 0.0 }, now).unwrap().unwrap_err();
    assert_eq!(refused.kind, LimitKind::Tokens);
    assert!((refused.retry_after_s - 40.0).abs() < 1e-6, "{}", refused.retry_after_s);
    assert_eq!(s.status(&c, now).unwrap().tokens.unwrap().remaining, 20);
}

#[test]
fn a_foreign_or_corrupt_file_is_refused_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let foreign = dir.path().join("other.sqlite");
    Connection::open(&foreign).unwrap().execute_batch("CREATE TABLE notes(x)").unwrap();
    let e = SqliteStore::open(&foreign, 30.0, 60.0).unwrap_err().to_string();
    assert!(e.contains("other.sqlite") && e.contains("not an lmplex usage store"), "{e}");
    let junk = dir.path().join("junk.sqlite");
    std::fs::write(&junk, vec![7u8; 4096]).unwrap();
    let e = SqliteStore::open(&junk, 30.0, 60.0).unwrap_err().to_string();
    assert!(e.contains("junk.sqlite") && e.contains("not a database"), "{e}");
    assert_eq!(std::fs::read(&junk).unwrap(), vec![7u8; 4096], "nothing written");
}

#[test]
fn servers_starting_together_on_a_new_file_all_open_it() {
    for round in 0..20 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("usage.sqlite");
        let opened: Vec<_> = (0..6)
            .map(|_| {
                let path = path.clone();
                std::thread::spawn(move || SqliteStore::open(&path, 30.0, 60.0).map(drop))
            })
            .collect();
        for t in opened {
            if let Err(e) = t.join().unwrap() {
                panic!("round {round}: {e}");
            }
        }
    }
}
