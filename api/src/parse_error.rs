//! A JSON body for the answers hyper gives by itself to an HTTP/1 request it cannot parse.
//!
//! Every answer of the HTTP listener that a route gives carries a JSON body naming what was
//! wrong (`dashboard::ApiError`). A request hyper cannot parse — a request target with a raw
//! space, quote or non-ASCII byte (`curl '…/api/lookup?q="x"'`), a head too large — never
//! reaches a route: hyper answers it itself, `400 Bad Request` (or 414, 431) with
//! `connection: close` and an empty body, and offers no way to give another. [`Explained`]
//! wraps a connection's stream and rewrites exactly that answer as it is written, adding
//! `content-type: application/json` and `{"error": …}`. It reads nothing and changes no
//! other byte: an answer a route gave always has a body, or no `connection: close`.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The answers hyper gives by itself to a request it cannot parse (`proto::h1::role`'s
/// `on_error`), and what their body says.
const EXPLAINED: [(&[u8], &str); 3] = [
    (
        b"HTTP/1.1 400 Bad Request\r\n",
        "the request could not be read as HTTP/1.1: its method, target, version or a header \
         is malformed (a space, quote or byte beyond ASCII in the target must be \
         percent-encoded)",
    ),
    (
        b"HTTP/1.1 414 URI Too Long\r\n",
        "the request's target is too long",
    ),
    (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\n",
        "the request's head is too large",
    ),
];

/// The head's lines that mark hyper's own answer: it closes the connection, with no body.
const NO_BODY: &[u8] = b"\r\ncontent-length: 0\r\n";
const CLOSE: &[u8] = b"\r\nconnection: close\r\n";

/// `head` (one write of a whole response head, as hyper writes it when its stream is not
/// vectored) with a JSON body explaining it, when it is hyper's own answer to a request it
/// could not parse; `None` for any other bytes.
pub fn explained(head: &[u8]) -> Option<Vec<u8>> {
    let (_, why) = EXPLAINED.iter().find(|(line, _)| head.starts_with(line))?;
    let end = find(head, b"\r\n\r\n")?;
    if end + 4 != head.len() {
        return None; // a body follows: a route's answer
    }
    let lines = &head[..end + 2];
    if find(lines, NO_BODY).is_none() || find(lines, CLOSE).is_none() {
        return None;
    }
    let body = serde_json::json!({ "error": why }).to_string();
    let mut out = Vec::with_capacity(head.len() + body.len() + 64);
    let at = find(lines, NO_BODY)?;
    out.extend_from_slice(&lines[..at]);
    out.extend_from_slice(format!("\r\ncontent-length: {}\r\n", body.len()).as_bytes());
    out.extend_from_slice(&lines[at + NO_BODY.len()..]);
    out.extend_from_slice(b"content-type: application/json\r\n\r\n");
    out.extend_from_slice(body.as_bytes());
    Some(out)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// A connection's stream whose writes of hyper's own parse-error answers are [`explained`].
pub struct Explained<S> {
    inner: S,
    /// A rewritten answer being written: its bytes, how many are written, and how many bytes
    /// of the caller's it stands for.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<S> Explained<S> {
    pub fn new(inner: S) -> Explained<S> {
        Explained {
            inner,
            pending: None,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Explained<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Explained<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let me = self.get_mut();
        if me.pending.is_none() {
            match explained(buf) {
                Some(rewritten) => me.pending = Some((rewritten, 0, buf.len())),
                None => return Pin::new(&mut me.inner).poll_write(cx, buf),
            }
        }
        // The rewritten answer, written whole before the caller's bytes count as written
        // (the caller offers the same bytes again after `Pending`).
        while let Some((bytes, written, stands_for)) = me.pending.as_mut() {
            if *written == bytes.len() {
                let n = *stands_for;
                me.pending = None;
                return Poll::Ready(Ok(n));
            }
            match Pin::new(&mut me.inner).poll_write(cx, &bytes[*written..]) {
                Poll::Ready(Ok(0)) => {
                    return Poll::Ready(Err(std::io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => *written += n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Ready(Ok(0))
    }

    /// Not vectored: hyper then writes a response head in one buffer, which is what
    /// [`explained`] looks at.
    fn is_write_vectored(&self) -> bool {
        false
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// hyper's own answer to an unparsable request gets a JSON body saying so, its length
    /// set; a route's answers, with a body or without `connection: close`, are left alone.
    #[test]
    fn only_hypers_own_parse_error_answers_are_explained() {
        let hyper_400 = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\ndate: Mon, 07 Dec 2026 00:34:06 GMT\r\n\r\n";
        let out = explained(hyper_400).expect("explained");
        let text = String::from_utf8(out).expect("UTF-8");
        let (head, body) = text.split_once("\r\n\r\n").expect("a head and a body");
        assert!(head.starts_with("HTTP/1.1 400 Bad Request\r\n"), "{head}");
        assert!(head.contains("\r\nconnection: close\r\n"), "{head}");
        assert!(head.contains("\r\ndate: Mon, 07 Dec 2026"), "{head}");
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(
            head.contains(&format!("content-length: {}", body.len())),
            "{head}"
        );
        let json: serde_json::Value = serde_json::from_str(body).expect("JSON");
        assert!(json["error"]
            .as_str()
            .is_some_and(|e| e.contains("percent-encoded")));
        let too_large =
            b"HTTP/1.1 431 Request Header Fields Too Large\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        assert!(explained(too_large).is_some());
        for other in [
            // A route's 400, with its body.
            &b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 2\r\n\r\n{}"[..],
            // A 400 with no body that keeps the connection.
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n",
            // Any other status.
            b"HTTP/1.1 404 Not Found\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            // Not a whole head.
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n",
        ] {
            assert_eq!(explained(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    /// Through the stream: the rewritten answer is written whole (over a peer that takes a
    /// few bytes at a time), and counted as the caller's bytes.
    #[tokio::test]
    async fn the_rewritten_answer_is_written_whole() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (ours, mut theirs) = tokio::io::duplex(7);
        let mut stream = Explained::new(ours);
        let hyper_400 =
            b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        let want = explained(hyper_400).expect("explained");
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            theirs.read_to_end(&mut got).await.expect("read");
            got
        });
        stream.write_all(hyper_400).await.expect("write");
        stream.write_all(b"after").await.expect("write");
        stream.shutdown().await.expect("shutdown");
        drop(stream);
        let got = reader.await.expect("the reader");
        assert_eq!(got, [want, b"after".to_vec()].concat());
    }
}
