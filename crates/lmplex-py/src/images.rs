//! A chat message's content parts from Python: text, and images for a vision-language model.
//!
//! A part is `{"type": "text", "text": str}`, `{"type": "image", "image": X}` or OpenAI's
//! `{"type": "image_url", "image_url": {"url": str}}`. An image `X` is the file's bytes
//! (`bytes`, `bytearray`), a path (`str` or `os.PathLike`), a `data:` URL, or a PIL image
//! (saved losslessly as PNG; a mode PNG cannot hold is converted to RGB first, as the
//! processors' `convert_rgb` would). The bytes are decoded by the model's processor, in Rust.
//!
//! Invariant: an image that cannot be read is `InvalidRequest` naming the part; nothing is
//! fetched from the network (an `http(s)` URL is refused: pass the bytes).

use crate::errors::invalid;
use lmplex_model::chat::ContentPart;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyMapping, PyString};
use std::sync::Arc;

/// PIL modes a PNG holds as they are.
const PNG_MODES: [&str; 8] = ["1", "L", "LA", "P", "RGB", "RGBA", "I", "I;16"];

/// `content` as parts: a list of part dicts (`None` for a plain string).
pub(crate) fn parts(content: &Bound<'_, PyAny>) -> PyResult<Option<Vec<ContentPart>>> {
    let Ok(list) = content.cast::<PyList>() else { return Ok(None) };
    list.iter().enumerate().map(|(i, p)| part(&p).map_err(|e| at(i, e))).collect::<PyResult<_>>().map(Some)
}

fn at(i: usize, e: PyErr) -> PyErr {
    Python::attach(|py| invalid(format!("content part {i}: {}", e.value(py))))
}

fn part(p: &Bound<'_, PyAny>) -> PyResult<ContentPart> {
    let d = p.cast::<PyMapping>().map_err(|_| invalid("must be a dict with a 'type'"))?;
    let get = |k: &str| d.get_item(k).ok().filter(|v| !v.is_none());
    let kind: String = get("type").ok_or_else(|| invalid("has no 'type'"))?.extract()?;
    match kind.as_str() {
        "text" => {
            let t = get("text").ok_or_else(|| invalid("a 'text' part needs its 'text'"))?;
            Ok(ContentPart::Text(t.extract().map_err(|_| invalid("'text' must be a str"))?))
        }
        "image" => {
            Ok(ContentPart::Image(image(&get("image").ok_or_else(|| invalid("an 'image' part needs its 'image'"))?)?))
        }
        "image_url" => {
            let u = get("image_url").ok_or_else(|| invalid("an 'image_url' part needs its 'image_url'"))?;
            let url = match u.cast::<PyMapping>() {
                Ok(m) => m.get_item("url").map_err(|_| invalid("'image_url' needs its 'url'"))?,
                Err(_) => u,
            };
            let url: String = url.extract().map_err(|_| invalid("'image_url.url' must be a str"))?;
            Ok(ContentPart::Image(from_str(&url)?))
        }
        other => Err(invalid(format!("type '{other}' is not a content part (text, image or image_url)"))),
    }
}

/// An image value's file bytes.
fn image(v: &Bound<'_, PyAny>) -> PyResult<Arc<[u8]>> {
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(b.as_bytes().into());
    }
    if let Ok(b) = v.cast::<PyByteArray>() {
        return Ok(b.to_vec().into());
    }
    if let Ok(s) = v.cast::<PyString>() {
        return from_str(&s.to_cow()?);
    }
    let py = v.py();
    if v.hasattr("save")? && v.hasattr("mode")? {
        let mode: String = v.getattr("mode")?.extract()?;
        let img = if PNG_MODES.contains(&mode.as_str()) { v.clone() } else { v.call_method1("convert", ("RGB",))? };
        let buf = py.import("io")?.getattr("BytesIO")?.call0()?;
        img.call_method1("save", (&buf, "PNG"))?;
        return Ok(buf.call_method0("getvalue")?.cast::<PyBytes>()?.as_bytes().into());
    }
    let os = py.import("os")?;
    if v.is_instance(&os.getattr("PathLike")?)? {
        let path: String = os.getattr("fspath")?.call1((v,))?.extract()?;
        return from_str(&path);
    }
    Err(invalid(format!("an image is bytes, a path, a data: URL or a PIL image, not {}", v.get_type().name()?)))
}

/// A `data:` URL's bytes, or a file's at the path `s`.
fn from_str(s: &str) -> PyResult<Arc<[u8]>> {
    if s.starts_with("data:") {
        return lmplex_image::data_url(s).map(Into::into).map_err(|e| invalid(e.to_string()));
    }
    if s.starts_with("http://") || s.starts_with("https://") {
        return Err(invalid("image URLs are not fetched: pass the image's bytes, a path or a data: URL"));
    }
    std::fs::read(s).map(Into::into).map_err(|e| invalid(format!("cannot read the image file '{s}': {e}")))
}
