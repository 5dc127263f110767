//! `data:` URLs (RFC 2397) to the bytes they carry: how OpenAI's `image_url` parts and Python
//! strings send an image inline.
//!
//! Invariant: only base64 data URLs of an `image/*` type (or no type) are accepted; anything
//! else is `InvalidRequest` saying what was wrong, never a panic.

use lmplex_core::{Error, Result};

/// The bytes of `data:[image/TYPE][;PARAM...];base64,DATA`.
pub fn data_url(url: &str) -> Result<Vec<u8>> {
    let rest = url.strip_prefix("data:").ok_or_else(|| Error::invalid("not a data: URL"))?;
    let (meta, data) = rest.split_once(',').ok_or_else(|| Error::invalid("a data: URL needs a ',' before its data"))?;
    let mut fields = meta.split(';');
    let media = fields.next().unwrap_or_default().trim();
    if !media.is_empty() && !media.to_ascii_lowercase().starts_with("image/") {
        return Err(Error::invalid(format!("the data: URL holds '{media}', not an image")));
    }
    if !fields.any(|f| f.trim().eq_ignore_ascii_case("base64")) {
        return Err(Error::invalid("the data: URL must be base64 (data:image/png;base64,...)"));
    }
    let data: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::decode(data.as_bytes()).map_err(|e| Error::invalid(format!("the data: URL's base64 is invalid: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_base64_image_urls_and_names_what_is_wrong() {
        assert_eq!(data_url("data:image/png;base64,aGVsbG8=").unwrap(), b"hello");
        assert_eq!(data_url("data:;base64,aGVs\nbG8=").unwrap(), b"hello");
        for (bad, want) in [
            ("http://x/y.png", "not a data: URL"),
            ("data:image/png;base64", "needs a ','"),
            ("data:text/plain;base64,aGk=", "'text/plain', not an image"),
            ("data:image/png,rawdata", "must be base64"),
            ("data:image/png;base64,@@@", "base64 is invalid"),
        ] {
            let e = data_url(bad).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }
}
