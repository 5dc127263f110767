//! lmplex-image against transformers' Idefics3 PIL image processor and Pillow, bit for bit.
//!
//! The fixtures (`tests/fixtures/images/`) come from `scripts/make_image_fixtures.py`, run with
//! transformers and Pillow (not in CI): the images, three processor configs, what transformers
//! makes of each image under each config (`idefics3.json`), and Pillow's resize of hashed noise
//! for random sizes and every filter (`resample.json`).
//!
//! Every format decodes to Pillow's exact bytes (JPEG through libjpeg-turbo, Pillow's own
//! decoder), so every case runs the whole chain, from the file's bytes. For the JPEGs the
//! fixtures also keep Pillow's decoding losslessly (`NAME.pil.png`), and `jpeg.json` records
//! Pillow's decoding of more JPEGs (`jpeg/`: subsamplings, progressive, restart markers, ...).

mod common;

use common::{check_pixels, fixtures, processor_input, read_json, sha256_hex, Pixels};
use std::collections::HashMap;

use lmplex_core::Error;
use lmplex_image::{decode, prompt_string, resize, Filter, Idefics3Processor, ImageLimits, RgbImage};
use serde::Deserialize;

#[derive(Deserialize)]
struct Decoded {
    width: usize,
    height: usize,
    rgb_sha256: String,
    /// For JPEGs of `idefics3.json`: Pillow's decoding, as a PNG.
    #[serde(default)]
    pil_rgb: Option<String>,
}

#[derive(Deserialize)]
struct Case {
    image: String,
    config: String,
    rows: usize,
    cols: usize,
    prompt: Option<String>,
    prompt_sha256: Option<String>,
    #[serde(flatten)]
    pixels: Pixels,
}

#[derive(Deserialize)]
struct Batch {
    images: Vec<String>,
    config: String,
    #[serde(flatten)]
    pixels: Pixels,
}

#[derive(Deserialize)]
struct Fixture {
    transformers: String,
    images: HashMap<String, Decoded>,
    cases: Vec<Case>,
    batch: Batch,
}

fn fixture() -> Fixture {
    read_json("idefics3.json")
}

#[test]
fn fixtures_come_from_transformers_5() {
    let f = fixture();
    assert!(f.transformers.starts_with("5."), "{}", f.transformers);
    assert_eq!(f.images.len(), 14);
    assert_eq!(f.cases.len(), 24);
}

/// Checks each image's decoding against Pillow's record; returns the names that differ.
fn decode_failures(images: &HashMap<String, Decoded>) -> Vec<String> {
    let mut failures = vec![];
    for (name, want) in images {
        let img = processor_input(name);
        assert_eq!((img.width(), img.height()), (want.width, want.height), "{name}");
        if sha256_hex(img.pixels()) != want.rgb_sha256 {
            let mut msg = name.clone();
            // With Pillow's decoding at hand, say where and by how much.
            if let Some(pil) = &want.pil_rgb {
                let pil = processor_input(pil);
                let diffs: Vec<u8> = img.pixels().iter().zip(pil.pixels()).map(|(a, b)| a.abs_diff(*b)).collect();
                let count = diffs.iter().filter(|&&d| d > 0).count();
                let max = diffs.iter().copied().max().unwrap_or(0);
                msg += &format!(" ({count} of {} values differ, by up to {max})", diffs.len());
            }
            failures.push(msg);
        }
    }
    failures.sort();
    failures
}

/// Decoding gives the bytes of `np.array(convert_to_rgb(PIL.Image.open(path)))`, bit for bit,
/// JPEGs included.
#[test]
fn decode_matches_pil_convert_to_rgb() {
    let f = fixture();
    for (name, want) in &f.images {
        if let Some(pil) = &want.pil_rgb {
            assert_eq!(
                sha256_hex(processor_input(pil).pixels()),
                want.rgb_sha256,
                "{name}: the stored Pillow decoding"
            );
        }
    }
    let failures = decode_failures(&f.images);
    assert!(failures.is_empty(), "decoded RGB differs from PIL's for {failures:?}");
}

#[derive(Deserialize)]
struct JpegFixture {
    pillow: String,
    images: HashMap<String, Decoded>,
}

/// More JPEGs (`jpeg/`), one per encoder setting that changes the decoder's path: each decodes to
/// Pillow's bytes. The EXIF one keeps its stored orientation, as `Image.open` does.
#[test]
fn jpeg_decoding_is_pillows_bit_for_bit() {
    let text = std::fs::read_to_string(fixtures().join("jpeg.json")).unwrap();
    let f: JpegFixture = serde_json::from_str(&text).unwrap();
    assert!(f.pillow.starts_with("13."), "{}", f.pillow);
    assert_eq!(f.images.len(), 13);
    let failures = decode_failures(&f.images);
    assert!(failures.is_empty(), "decoded RGB differs from PIL's for {failures:?}");
}

#[test]
fn idefics3_matches_transformers_bit_for_bit() {
    let f = fixture();
    let mut processors = HashMap::new();
    let mut failures = vec![];
    for case in &f.cases {
        let processor = processors
            .entry(case.config.clone())
            .or_insert_with(|| Idefics3Processor::from_folder(fixtures().join(&case.config)).unwrap());
        let what = format!("{} / {}", case.image, case.config);
        let out = processor.process(&[processor_input(&case.image)]).unwrap();
        assert_eq!(out.images.len(), 1);
        let image = &out.images[0];
        let shape = [1, image.tiles, 3, image.height, image.width];
        assert_eq!(&shape[..], &case.pixels.shape[..], "{what}: shape");
        assert_eq!((image.rows, image.cols), (case.rows, case.cols), "{what}: rows, cols");
        assert_eq!(image.pixel_values.len(), shape.iter().product::<usize>(), "{what}");
        // Every Idefics3 tile is max_image_size squared: the mask is all ones.
        assert!(image.pixel_attention_mask().unwrap().iter().all(|&m| m == 1), "{what}: mask");
        let prompt = processor.image_prompt(image.rows, image.cols);
        match (&case.prompt, &case.prompt_sha256) {
            (Some(want), _) => assert_eq!(&prompt, want, "{what}: prompt"),
            (None, Some(sha)) => assert_eq!(&sha256_hex(prompt.as_bytes()), sha, "{what}: prompt:\n{prompt}"),
            (None, None) => panic!("{what}: no prompt recorded"),
        }
        if let Err(e) = check_pixels(&what, &image.pixel_values, 3 * image.height * image.width, &case.pixels) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Two images in one call: transformers' one sample of `tiles(a) + tiles(b)` tiles.
#[test]
fn idefics3_two_images_concatenate_like_transformers() {
    let f = fixture();
    let processor = Idefics3Processor::from_folder(fixtures().join(&f.batch.config)).unwrap();
    let images: Vec<RgbImage> = f.batch.images.iter().map(|n| processor_input(n)).collect();
    let out = processor.process(&images).unwrap();
    let tiles: usize = out.images.iter().map(|i| i.tiles).sum();
    let (h, w) = (out.images[0].height, out.images[0].width);
    assert_eq!(&[1, tiles, 3, h, w][..], &f.batch.pixels.shape[..]);
    let all: Vec<f32> = out.images.iter().flat_map(|i| i.pixel_values.iter().copied()).collect();
    check_pixels("two images", &all, 3 * h * w, &f.batch.pixels).unwrap();
}

#[test]
fn prompt_string_matches_transformers_for_an_unsplit_image() {
    let f = fixture();
    let case = f.cases.iter().find(|c| c.rows == 0).expect("a case without splitting");
    assert_eq!(Some(prompt_string(0, 0, 3)), case.prompt);
}

#[derive(Deserialize)]
struct ResampleCase {
    name: String,
    input: [usize; 2],
    output: [usize; 2],
    resample: i64,
    sha256: String,
    first: Vec<u8>,
}

#[derive(Deserialize)]
struct ResampleFixture {
    cases: Vec<ResampleCase>,
}

/// `hashed_bytes` of scripts/make_image_fixtures.py: the top byte of murmur3's finalizer over
/// `i * 0x9E3779B9 ^ fnv1a(name)`.
fn hashed_bytes(name: &str, n: usize) -> Vec<u8> {
    let seed = name.bytes().fold(0x811C_9DC5u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    (0..n as u32)
        .map(|i| {
            let mut x = i.wrapping_mul(0x9E37_79B9) ^ seed;
            x ^= x >> 16;
            x = x.wrapping_mul(0x85EB_CA6B);
            x ^= x >> 13;
            x = x.wrapping_mul(0xC2B2_AE35);
            x ^= x >> 16;
            (x >> 24) as u8
        })
        .collect()
}

/// Pillow's `Image.resize` of noise, for random sizes up and down and every filter.
#[test]
fn resize_matches_pillow_on_random_sizes() {
    let text = std::fs::read_to_string(fixtures().join("resample.json")).unwrap();
    let fixture: ResampleFixture = serde_json::from_str(&text).unwrap();
    assert!(fixture.cases.len() >= 200);
    let mut failures = vec![];
    for c in &fixture.cases {
        let [w, h] = c.input;
        let src = RgbImage::new(w, h, hashed_bytes(&c.name, w * h * 3)).unwrap();
        let filter = Filter::from_pil(c.resample).unwrap();
        let out = resize(&src, c.output[0], c.output[1], filter);
        assert_eq!((out.width(), out.height()), (c.output[0], c.output[1]));
        if sha256_hex(out.pixels()) != c.sha256 {
            failures.push(format!(
                "{}: {w}x{h} -> {}x{} {filter:?}: first bytes {:?}, Pillow {:?}",
                c.name,
                c.output[0],
                c.output[1],
                &out.pixels()[..c.first.len()],
                c.first
            ));
        }
    }
    assert!(failures.is_empty(), "{} of {} differ:\n{}", failures.len(), fixture.cases.len(), failures.join("\n"));
}

fn invalid_request(result: lmplex_core::Result<RgbImage>) -> String {
    match result {
        Err(Error::InvalidRequest(msg)) => msg,
        other => panic!("expected InvalidRequest, got {other:?}"),
    }
}

#[test]
fn truncated_png_is_refused_naming_the_problem() {
    let bytes = std::fs::read(fixtures().join("rgb.png")).unwrap();
    let msg = invalid_request(decode(&bytes[..bytes.len() / 2], &ImageLimits::default()));
    assert!(msg.contains("PNG") && msg.contains("37x53"), "{msg}");
}

fn jpeg_fixture(name: &str) -> Vec<u8> {
    std::fs::read(fixtures().join(name)).unwrap()
}

/// The offset of a JPEG's frame header (its SOF0 or SOF2 marker), found by walking the segments.
fn frame_header(jpeg: &[u8]) -> usize {
    let mut at = 2;
    while !matches!(jpeg[at + 1], 0xC0 | 0xC2) {
        assert_eq!(jpeg[at], 0xFF, "a marker at {at}");
        at += 2 + usize::from(u16::from_be_bytes([jpeg[at + 2], jpeg[at + 3]]));
    }
    at
}

/// Cut short anywhere before its last bytes, a JPEG is refused, as Pillow refuses it ("image file
/// is truncated"), never completed with made-up rows.
#[test]
fn truncated_jpeg_is_refused_as_pillow_refuses_it() {
    for name in ["photo.jpg", "cmyk.jpg", "jpeg/progressive.jpg", "jpeg/gray.jpg"] {
        let bytes = jpeg_fixture(name);
        let img = decode(&bytes, &ImageLimits::default()).unwrap();
        let dims = format!("{}x{}", img.width(), img.height());
        // The header ends with the first scan's header (SOS).
        let sos = bytes.windows(2).position(|w| w == [0xFF, 0xDA]).unwrap();
        let header_end = sos + 2 + usize::from(u16::from_be_bytes([bytes[sos + 2], bytes[sos + 3]]));
        for cut in (3..bytes.len() - 2).step_by(41).chain([bytes.len() - 2]) {
            let msg = invalid_request(decode(&bytes[..cut], &ImageLimits::default()));
            assert!(msg.contains("JPEG") && msg.contains("truncated"), "{name} cut at {cut}: {msg}");
            if cut > header_end {
                assert!(msg.contains(&format!("cannot decode the {dims} JPEG")), "{name} cut at {cut}: {msg}");
            }
        }
    }
}

/// A JPEG's size comes from its frame header; one over the limit is refused before any scan is
/// read (this file's data is far too short for its claimed size).
#[test]
fn oversized_jpeg_is_refused_before_its_pixels_are_decoded() {
    let mut bytes = jpeg_fixture("photo.jpg");
    let sof = frame_header(&bytes);
    bytes[sof + 5..sof + 9].copy_from_slice(&[0x23, 0x28, 0x27, 0x10]); // 9000 rows, 10000 columns
    let msg = invalid_request(decode(&bytes, &ImageLimits::default()));
    assert!(msg.contains("JPEG image is 10000x9000 = 90000000 pixels, over the limit"), "{msg}");
    let msg =
        invalid_request(decode(&jpeg_fixture("photo.jpg"), &ImageLimits { max_pixels: 3071, ..Default::default() }));
    assert!(msg.contains("64x48 = 3072 pixels, over the limit of 3071"), "{msg}");
}

/// What Pillow cannot read either: 12-bit samples, 2 components; libjpeg's message, no exit.
#[test]
fn unsupported_jpegs_are_refused_with_libjpegs_reason() {
    let mut bytes = jpeg_fixture("photo.jpg");
    let sof = frame_header(&bytes);
    bytes[sof + 4] = 12;
    let msg = invalid_request(decode(&bytes, &ImageLimits::default()));
    assert!(msg.contains("cannot read the JPEG image's header") && msg.contains("precision 12"), "{msg}");
    // Two components: the second one's table entries dropped, the segment shortened to match.
    let mut bytes = jpeg_fixture("jpeg/gray.jpg");
    let sof = frame_header(&bytes);
    assert_eq!(bytes[sof + 9], 1, "one component");
    let second = [2, 0x11, 0];
    bytes[sof + 9] = 2;
    bytes[sof + 3] += 3;
    bytes.splice(sof + 13..sof + 13, second);
    let msg = invalid_request(decode(&bytes, &ImageLimits::default()));
    assert!(msg.contains("2 components"), "{msg}");
}

/// Each scan of a progressive file walks the whole image: a file of more than 500 is refused
/// (here the last scan repeated; libjpeg takes the repeats as a bogus progression and goes on).
#[test]
fn jpeg_with_too_many_scans_is_refused() {
    let bytes = jpeg_fixture("jpeg/progressive.jpg");
    let last_scan = bytes.windows(2).rposition(|w| w == [0xFF, 0xDA]).unwrap();
    let scans = bytes.windows(2).filter(|w| *w == [0xFF, 0xDA]).count();
    let with_scans = |n: usize| {
        let mut out = bytes[..bytes.len() - 2].to_vec();
        for _ in scans..n {
            out.extend_from_slice(&bytes[last_scan..bytes.len() - 2]);
        }
        out.extend_from_slice(&[0xFF, 0xD9]);
        out
    };
    assert!(decode(&with_scans(500), &ImageLimits::default()).is_ok());
    let msg = invalid_request(decode(&with_scans(501), &ImageLimits::default()));
    assert!(msg.contains("cannot decode the 37x27 JPEG image: it has more than 500 scans"), "{msg}");
}

/// A PNG chunk: length, type and data, CRC-32.
fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
    let body: Vec<u8> = kind.iter().chain(data).copied().collect();
    let crc = body.iter().fold(!0u32, |mut c, &b| {
        c ^= u32::from(b);
        for _ in 0..8 {
            c = if c & 1 != 0 { 0xEDB8_8320 ^ (c >> 1) } else { c >> 1 };
        }
        c
    });
    let mut out = (data.len() as u32).to_be_bytes().to_vec();
    out.extend(body);
    out.extend((!crc).to_be_bytes());
    out
}

/// A PNG whose header claims `width x height` 8-bit RGB, followed by an IDAT chunk of 16 bytes
/// that are no zlib stream: decoding any pixel fails.
fn png_header(width: u32, height: u32) -> Vec<u8> {
    let mut ihdr = width.to_be_bytes().to_vec();
    ihdr.extend(height.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(chunk(b"IHDR", &ihdr));
    png.extend(chunk(b"IDAT", &[0xAB; 16]));
    png.extend(chunk(b"IEND", &[]));
    png
}

/// The refusal comes from the header: the file's pixel data is garbage, and the message is the
/// limit's, not a decoding error.
#[test]
fn oversized_image_is_refused_before_its_pixels_are_decoded() {
    let msg = invalid_request(decode(&png_header(100_000, 90_000), &ImageLimits::default()));
    assert!(msg.contains("100000x90000") && msg.contains("over the limit of 67108864 pixels"), "{msg}");
    // Under the limit, the same kind of file fails later, for want of pixels.
    let msg = invalid_request(decode(&png_header(64, 64), &ImageLimits::default()));
    assert!(msg.contains("cannot decode the 64x64 PNG"), "{msg}");
    // A real image over a small limit.
    let bytes = std::fs::read(fixtures().join("gray.png")).unwrap();
    let msg = invalid_request(decode(&bytes, &ImageLimits { max_pixels: 4095, ..ImageLimits::default() }));
    assert!(msg.contains("64x64 = 4096 pixels, over the limit of 4095"), "{msg}");
    let msg = invalid_request(decode(&bytes, &ImageLimits { max_bytes: 100, ..ImageLimits::default() }));
    assert!(msg.contains("over the limit of 100 bytes"), "{msg}");
}

#[test]
fn random_and_empty_bytes_are_refused() {
    let noise = hashed_bytes("not an image", 4096);
    let msg = invalid_request(decode(&noise, &ImageLimits::default()));
    assert!(msg.starts_with("not a PNG, JPEG, WebP or GIF image (4096 bytes"), "{msg}");
    let msg = invalid_request(decode(&[], &ImageLimits::default()));
    assert!(msg.contains("0 bytes"), "{msg}");
    // The right magic bytes followed by noise.
    let mut fake = b"\x89PNG\r\n\x1a\n".to_vec();
    fake.extend(&noise);
    let msg = invalid_request(decode(&fake, &ImageLimits::default()));
    assert!(msg.contains("PNG"), "{msg}");
    let mut fake = vec![0xFF, 0xD8, 0xFF];
    fake.extend(&noise);
    let msg = invalid_request(decode(&fake, &ImageLimits::default()));
    assert!(msg.contains("JPEG"), "{msg}");
}

/// Corrupted fixtures (bytes flipped, cut short): decoding gives an image or `InvalidRequest`,
/// never a panic or another error kind.
#[test]
fn corrupted_images_are_refused_or_decoded_without_panicking() {
    let f = fixture();
    let mut names: Vec<&String> = f.images.keys().collect();
    names.sort();
    let mut refused = 0;
    for (n, name) in names.iter().enumerate() {
        let bytes = std::fs::read(fixtures().join(name)).unwrap();
        for round in 0..40 {
            let noise = hashed_bytes(&format!("{name}-{round}"), 16);
            let mut bad = bytes.clone();
            for pair in noise.chunks(2).take(1 + round % 8) {
                let at = (usize::from(pair[0]) * 257 + usize::from(pair[1]) * 31 + round) % bad.len();
                bad[at] ^= pair[1] | 1;
            }
            if round % 5 == 0 {
                bad.truncate(bad.len() * (n + round + 1) % bad.len().max(1));
            }
            match decode(&bad, &ImageLimits::default()) {
                Ok(img) => assert!(img.width() > 0 && img.height() > 0),
                Err(Error::InvalidRequest(_)) => refused += 1,
                Err(e) => panic!("{name} round {round}: {e:?}"),
            }
        }
    }
    assert!(refused > 0, "no corruption was noticed");
}
