//! The API's TCP listener, so that every answer of halo-server is JSON.
//!
//! hyper answers some requests itself, before any router runs, with an empty body and
//! no content type: 400 for a request it cannot parse, 414 for a path over 64 KiB, 431
//! for more than 100 headers or a request head over ~400 KiB. It has no hook for those
//! answers, so this listener's connections rewrite exactly them on the way out into the
//! API's error shape (`{"error": "<code>", "message": "..."}`). Only a 4xx head with
//! `content-length: 0`, no content type and nothing after it matches: every answer of
//! the router carries a content type (see `http::json_errors`), so nothing else can.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A TCP listener whose connections are [`JsonRefusals`].
#[derive(Debug)]
pub struct JsonListener(pub TcpListener);

impl axum::serve::Listener for JsonListener {
    type Io = JsonRefusals<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (io, addr) = axum::serve::Listener::accept(&mut self.0).await;
        (JsonRefusals::new(io), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}

/// The client's address, for `ConnectInfo` on a [`JsonListener`].
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub SocketAddr);

impl Connected<IncomingStream<'_, JsonListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, JsonListener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

/// A connection whose bare 4xx answers (hyper's own) are rewritten into JSON.
#[derive(Debug)]
pub struct JsonRefusals<Io> {
    io: Io,
    /// A rewritten answer being written: its bytes, how many are out, and how many bytes
    /// of the caller's buffer it stands for.
    pending: Option<(Vec<u8>, usize, usize)>,
}

impl<Io> JsonRefusals<Io> {
    pub fn new(io: Io) -> JsonRefusals<Io> {
        JsonRefusals { io, pending: None }
    }
}

/// The JSON answer that replaces `head`, if `head` is a bare 4xx answer.
pub fn rewrite(head: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(head).ok()?;
    let rest = text
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| text.strip_prefix("HTTP/1.0 "))?;
    let (status_line, headers) = rest.split_once("\r\n")?;
    let headers = headers.strip_suffix("\r\n\r\n").or_else(|| {
        // No header besides the status line.
        (headers == "\r\n").then_some("")
    })?;
    if headers.contains("\r\n\r\n") {
        return None;
    }
    let code: u16 = status_line.get(..3)?.parse().ok()?;
    if !(400..500).contains(&code) {
        return None;
    }
    let mut kept = Vec::new();
    let mut empty = false;
    for line in headers.split("\r\n").filter(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':')?;
        match name.trim().to_ascii_lowercase().as_str() {
            "content-type" | "transfer-encoding" => return None,
            "content-length" => empty = value.trim() == "0",
            _ => kept.push(line),
        }
    }
    if !empty {
        return None;
    }
    let message = match code {
        400 => "the request is not valid HTTP/1.1",
        414 => "the request path and query are longer than 64 KiB",
        431 => "the request's headers are too many (over 100) or too large (over 400 KiB)",
        _ => "the request was refused",
    };
    let status = axum::http::StatusCode::from_u16(code).ok()?;
    let body = super::ApiError::new(status, super::status_code_name(status), message)
        .body()
        .to_string();
    let mut out = format!("HTTP/1.1 {status_line}\r\n");
    for line in kept {
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str(&format!(
        "content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    Some(out.into_bytes())
}

impl<Io: AsyncRead + Unpin> AsyncRead for JsonRefusals<Io> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<Io: AsyncWrite + Unpin> AsyncWrite for JsonRefusals<Io> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.pending.is_none() {
            // hyper writes an answer's head in one buffer (writes are not vectored here),
            // so a bare refusal is always a whole `buf`.
            match rewrite(buf) {
                Some(json) => this.pending = Some((json, 0, buf.len())),
                None => return Pin::new(&mut this.io).poll_write(cx, buf),
            }
        }
        while let Some((bytes, done, _)) = &mut this.pending {
            if *done == bytes.len() {
                break;
            }
            let n = ready!(Pin::new(&mut this.io).poll_write(cx, &bytes[*done..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *done += n;
        }
        let stands_for = this.pending.take().map_or(0, |(_, _, len)| len);
        Poll::Ready(Ok(stands_for))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::rewrite;

    #[test]
    fn only_bare_4xx_heads_are_rewritten() {
        let bare = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 21:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(rewrite(bare).expect("rewritten")).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(head.contains("\r\ndate: Tue, 01 Dec 2026 21:00:00 GMT"));
        assert!(head.contains("\r\ncontent-type: application/json"));
        assert!(head.contains(&format!("\r\ncontent-length: {}", body.len())));
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"], "headers_too_large");

        for kept in [
            &b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n",
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 2\r\n\r\n{}",
            b"HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n",
            b"{\"error\": \"HTTP/1.1 400 \"}",
        ] {
            assert!(rewrite(kept).is_none(), "{}", String::from_utf8_lossy(kept));
        }
    }
}
