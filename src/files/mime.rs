//! MIME types from content (magic numbers, via `infer`) and the file name's extension (via
//! `mime_guess`); plain text when the bytes are UTF-8, octet-stream otherwise.

/// Detect a file's MIME type from its name and its first bytes.
pub fn detect(filename: &str, head: &[u8]) -> String {
    if let Some(kind) = infer::get(head) {
        return kind.mime_type().to_string();
    }
    if let Some(m) = mime_guess::from_path(filename).first() {
        return m.essence_str().to_string();
    }
    let text = match std::str::from_utf8(head) {
        Ok(_) => true,
        // A multi-byte character cut at the end of the sample is still text.
        Err(e) => e.error_len().is_none() && head.len() - e.valid_up_to() < 4,
    };
    if text && !head.contains(&0) {
        "text/plain".to_string()
    } else {
        "application/octet-stream".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::detect;

    #[test]
    fn content_then_extension_then_text() {
        let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
        assert_eq!(
            detect("report.txt", png),
            "image/png",
            "content wins over the extension"
        );
        assert_eq!(detect("summary.csv", b"a,b\n1,2\n"), "text/csv");
        assert_eq!(detect("notes", "héllo".as_bytes()), "text/plain");
        assert_eq!(
            detect("blob", &[0, 1, 2, 3, 255]),
            "application/octet-stream"
        );
        assert_eq!(detect("doc.pdf", b"%PDF-1.7\n"), "application/pdf");
    }
}
