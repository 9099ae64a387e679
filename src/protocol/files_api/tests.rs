use super::*;

/// A multipart parser over `chunks` (an input that never waits), metered as uploads are;
/// the bytes of file data read out, and how the parse ended.
async fn parse(chunks: Vec<Bytes>) -> (u64, u64, Result<(), multer::Error>) {
    let taken = Arc::new(AtomicU64::new(0));
    let input = futures_util::stream::iter(chunks.into_iter().map(Ok::<_, BodyCut>));
    let metered = Metered {
        inner: input,
        read: 0,
        last: 0,
        burst: 0,
        taken: taken.clone(),
    };
    let mut mp = multer::Multipart::new(metered, "XyZ");
    let mut data = 0u64;
    let result = async {
        while let Some(mut field) = mp.next_field().await? {
            while let Some(c) = field.chunk().await? {
                taken.fetch_add(c.len() as u64, Ordering::Relaxed);
                data += c.len() as u64;
            }
        }
        Ok(())
    }
    .await;
    (data, taken.load(Ordering::Relaxed), result)
}

#[tokio::test]
async fn a_body_whose_boundary_never_comes_is_refused_after_the_overhead_limit() {
    // 150 MiB without a boundary, in 16 KiB chunks; refused before 2 MiB are read.
    let reads = Arc::new(AtomicU64::new(0));
    let counter = reads.clone();
    let chunk = Bytes::from(vec![b'x'; 16 * 1024]);
    let input = futures_util::stream::repeat(chunk)
        .take(150 * 64)
        .inspect(move |c| {
            counter.fetch_add(c.len() as u64, Ordering::Relaxed);
        })
        .map(Ok::<_, BodyCut>);
    let metered = Metered {
        inner: input,
        read: 0,
        last: 0,
        burst: 0,
        taken: Arc::new(AtomicU64::new(0)),
    };
    let mut mp = multer::Multipart::new(metered, "XyZ");
    let Err(err) = mp.next_field().await else {
        panic!("a body without a boundary was accepted")
    };
    let api = multipart_error(&err, 100);
    assert_eq!(api.status, StatusCode::PAYLOAD_TOO_LARGE, "{err}");
    assert!(api.message.contains("outside its parts"), "{}", api.message);
    let read = reads.load(Ordering::Relaxed);
    assert!(read <= MULTIPART_OVERHEAD + 64 * 1024, "read {read} bytes");
}

#[tokio::test]
async fn a_large_part_from_an_input_that_never_waits_is_read_whole() {
    let mut body = b"--XyZ\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nhi\r\n--XyZ\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a.bin\"\r\n\r\n".to_vec();
    body.extend(std::iter::repeat_n(7u8, 5 * 1024 * 1024));
    body.extend_from_slice(b"\r\n--XyZ--\r\n");
    let chunks: Vec<Bytes> = body.chunks(8 * 1024).map(Bytes::copy_from_slice).collect();
    let (data, _, result) = parse(chunks).await;
    result.expect("parsed");
    assert_eq!(data, 5 * 1024 * 1024 + 2);
    // One chunk as large as the overhead limit is fine too.
    let (data, _, result) = parse(vec![Bytes::from(body)]).await;
    result.expect("parsed in one chunk");
    assert_eq!(data, 5 * 1024 * 1024 + 2);
}

#[test]
fn active_types() {
    for t in [
        "text/html",
        "text/html; charset=utf-8",
        "image/svg+xml",
        "application/xml",
        "text/xml",
        "text/javascript",
        "application/javascript",
        "application/xhtml+xml",
        "application/rss+xml",
    ] {
        assert!(is_active(t), "{t}");
    }
    for t in [
        "text/plain",
        "image/png",
        "application/pdf",
        "text/csv",
        "application/json",
    ] {
        assert!(!is_active(t), "{t}");
    }
}

#[test]
fn disposition() {
    assert_eq!(
        content_disposition("report.csv"),
        "attachment; filename=\"report.csv\""
    );
    assert_eq!(
        content_disposition("résumé 1.pdf"),
        "attachment; filename=\"r_sum_ 1.pdf\"; filename*=UTF-8''r%C3%A9sum%C3%A9%201.pdf"
    );
}
