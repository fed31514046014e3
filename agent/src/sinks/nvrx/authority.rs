//! A shim between the health-check socket and the gRPC server: grpc-core (grpcio 1.57 and
//! later, what NVRx's ft_launcher calls with) sends a Unix socket's %-encoded path as the
//! HTTP/2 `:authority` (`tmp%2Fnvhcd.sock`), which hyper's h2 refuses as malformed and
//! answers with a stream reset (hyperium/h2#487), so no call would ever succeed. The shim
//! passes every byte through but the client's request header blocks: each is decoded (HPACK,
//! in the client's table context) and encoded again (in a table context of the shim's own,
//! which the server follows) with an authority that is not a valid one replaced by
//! `localhost`, as grpc-go and the kubelet send over Unix sockets.

use loona_hpack::{Decoder, Encoder};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The client connection preface.
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The frame size every HTTP/2 peer accepts (SETTINGS_MAX_FRAME_SIZE's initial value).
const MAX_FRAME: usize = 16_384;
/// The largest header block reassembled from a client (h2's own default limit is 16 KiB of
/// decoded headers; a health check sends a few hundred bytes).
const MAX_BLOCK: usize = 64 * 1024;
/// A client must send the preface and its first request's headers within this of connecting
/// (a launcher sends them at once).
const FIRST_REQUEST: std::time::Duration = std::time::Duration::from_secs(2);

/// Why the client's bytes could not be relayed.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// Reading or writing failed.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Not an HTTP/2 client.
    #[error("not an HTTP/2 connection preface")]
    Preface,
    /// A header block that HPACK cannot decode, or one too large.
    #[error("bad header block: {0}")]
    Block(String),
    /// A frame larger than the server allows (SETTINGS_MAX_FRAME_SIZE, never raised).
    #[error("frame of {0} bytes is over 16 KiB")]
    Frame(usize),
    /// No preface and request headers within [`FIRST_REQUEST`].
    #[error("no request within 2 s of connecting")]
    Slow,
}

/// `read`, by `deadline` while there is one.
async fn by<T>(
    deadline: Option<tokio::time::Instant>,
    read: impl std::future::Future<Output = std::io::Result<T>>,
) -> Result<T, ShimError> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, read)
            .await
            .map_err(|_| ShimError::Slow)?
            .map_err(ShimError::from),
        None => read.await.map_err(ShimError::from),
    }
}

/// Whether `value` is an authority h2 accepts as it is (a host name, address, port).
fn acceptable(value: &[u8]) -> bool {
    !value.is_empty()
        && value
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~:[]@".contains(b))
}

/// One frame header's fields.
struct Frame {
    len: usize,
    kind: u8,
    flags: u8,
    stream: u32,
}

impl Frame {
    fn parse(h: &[u8; 9]) -> Self {
        Self {
            len: usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]),
            kind: h[3],
            flags: h[4],
            stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff,
        }
    }

    fn header(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
        let l = u32::try_from(len).unwrap_or(u32::MAX).to_be_bytes();
        let s = stream.to_be_bytes();
        [l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]
    }
}

/// Relay the client's bytes to the server, rewriting request header blocks. Returns when the
/// client closes.
pub async fn relay_requests<R, W>(mut from: R, mut to: W) -> Result<(), ShimError>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    // Until the first request's headers are in.
    let mut deadline = Some(tokio::time::Instant::now() + FIRST_REQUEST);
    let mut preface = [0u8; 24];
    by(deadline, from.read_exact(&mut preface)).await?;
    if &preface != PREFACE {
        return Err(ShimError::Preface);
    }
    to.write_all(&preface).await?;
    let mut decoder = Decoder::new();
    let mut encoder = Encoder::new();
    // The header block being reassembled: its stream, END_STREAM, and its fragments.
    let mut open: Option<(u32, u8, Vec<u8>)> = None;
    loop {
        let mut head = [0u8; 9];
        match by(deadline, from.read_exact(&mut head)).await {
            Ok(_) => {}
            Err(ShimError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
        let frame = Frame::parse(&head);
        if frame.len > MAX_FRAME {
            return Err(ShimError::Frame(frame.len));
        }
        let mut payload = vec![0u8; frame.len];
        by(deadline, from.read_exact(&mut payload)).await?;
        let fragment = match frame.kind {
            HEADERS => {
                let mut p: &[u8] = &payload;
                if frame.flags & PADDED != 0 {
                    let pad = usize::from(*p.first().ok_or(ShimError::Block("padding".into()))?);
                    p = p
                        .get(1..p.len().saturating_sub(pad))
                        .ok_or(ShimError::Block("padding".into()))?;
                }
                if frame.flags & PRIORITY != 0 {
                    p = p.get(5..).ok_or(ShimError::Block("priority".into()))?;
                }
                open = Some((frame.stream, frame.flags & END_STREAM, Vec::new()));
                p.to_vec()
            }
            CONTINUATION if open.is_some() => payload,
            _ => {
                to.write_all(&head).await?;
                to.write_all(&payload).await?;
                continue;
            }
        };
        let Some((stream, end_stream, block)) = open.as_mut() else {
            continue;
        };
        block.extend_from_slice(&fragment);
        if block.len() > MAX_BLOCK {
            return Err(ShimError::Block("header block too large".into()));
        }
        if frame.flags & END_HEADERS == 0 {
            continue;
        }
        let (stream, end_stream) = (*stream, *end_stream);
        deadline = None;
        let headers = decoder
            .decode(block)
            .map_err(|e| ShimError::Block(e.to_string()))?;
        open = None;
        let rewritten: Vec<(&[u8], &[u8])> = headers
            .iter()
            .map(|(name, value)| {
                if name.as_slice() == b":authority" && !acceptable(value) {
                    (name.as_slice(), b"localhost".as_slice())
                } else {
                    (name.as_slice(), value.as_slice())
                }
            })
            .collect();
        let encoded = encoder.encode(rewritten);
        let mut chunks = encoded.chunks(MAX_FRAME).peekable();
        let mut kind = HEADERS;
        let mut flags = end_stream;
        while let Some(chunk) = chunks.next() {
            if chunks.peek().is_none() {
                flags |= END_HEADERS;
            }
            to.write_all(&Frame::header(chunk.len(), kind, flags, stream))
                .await?;
            to.write_all(chunk).await?;
            kind = CONTINUATION;
            flags = 0;
        }
        if encoded.is_empty() {
            to.write_all(&Frame::header(0, HEADERS, end_stream | END_HEADERS, stream))
                .await?;
        }
    }
}

/// Relay one client connection to the server, both ways, until either side closes.
pub async fn relay(client: tokio::net::UnixStream, server: tokio::net::UnixStream) {
    let (client_read, mut client_write) = client.into_split();
    let (mut server_read, server_write) = server.into_split();
    let requests = relay_requests(client_read, server_write);
    let answers = tokio::io::copy(&mut server_read, &mut client_write);
    tokio::select! {
        r = requests => if let Err(e) = r {
            tracing::debug!(error = %e, "NVRx health-check connection closed.");
        },
        _ = answers => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What grpc-core sends: the preface, SETTINGS, then a request whose `:authority` is the
    /// %-encoded socket path, split over HEADERS and CONTINUATION, then its DATA.
    #[tokio::test]
    async fn a_percent_encoded_socket_path_becomes_localhost_and_the_rest_passes() {
        let mut client = Encoder::new();
        let headers: Vec<(&[u8], &[u8])> = vec![
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", b"/nvhcd.HealthCheckService/RunHealthCheck"),
            (b":authority", b"tmp%2Fnvhcd.sock"),
            (b"content-type", b"application/grpc"),
        ];
        let block = client.encode(headers.clone());
        let (first, rest) = block.split_at(10);
        let mut input = PREFACE.to_vec();
        input.extend(Frame::header(0, 0x4, 0, 0)); // SETTINGS
        input.extend(Frame::header(first.len(), HEADERS, 0, 1));
        input.extend(first);
        input.extend(Frame::header(rest.len(), CONTINUATION, END_HEADERS, 1));
        input.extend(rest);
        input.extend(Frame::header(3, 0x0, END_STREAM, 1)); // DATA
        input.extend(b"abc");
        // A second request on the same connection: the tables stay in step.
        let again = client.encode(headers.clone());
        input.extend(Frame::header(
            again.len(),
            HEADERS,
            END_HEADERS | END_STREAM,
            3,
        ));
        input.extend(&again);

        let mut out = Vec::new();
        relay_requests(input.as_slice(), &mut out)
            .await
            .expect("relay");

        assert_eq!(&out[..24], PREFACE);
        let mut at = 24;
        let mut frames = Vec::new();
        while at < out.len() {
            let head: [u8; 9] = out[at..at + 9].try_into().expect("head");
            let f = Frame::parse(&head);
            frames.push((
                f.kind,
                f.flags,
                f.stream,
                out[at + 9..at + 9 + f.len].to_vec(),
            ));
            at += 9 + f.len;
        }
        assert_eq!(frames.len(), 4, "SETTINGS, HEADERS, DATA, HEADERS");
        assert_eq!(frames[0].0, 0x4);
        assert_eq!(
            (frames[2].0, frames[2].3.as_slice()),
            (0x0, b"abc".as_slice())
        );
        let mut server = Decoder::new();
        for (i, stream) in [(1, 1), (3, 3)] {
            let (kind, flags, s, block) = &frames[i];
            assert_eq!((*kind, *s), (HEADERS, stream));
            assert_ne!(flags & END_HEADERS, 0);
            let decoded = server.decode(block).expect("decodes");
            let authority = decoded
                .iter()
                .find(|(n, _)| n == b":authority")
                .map(|(_, v)| v.clone());
            assert_eq!(authority.as_deref(), Some(b"localhost".as_slice()));
            assert!(decoded
                .iter()
                .any(|(n, v)| n == b":path" && v == b"/nvhcd.HealthCheckService/RunHealthCheck"));
        }
        assert_eq!(frames[3].1 & END_STREAM, END_STREAM);
    }

    #[tokio::test]
    async fn an_oversized_frame_and_a_silent_client_are_cut_off() {
        let mut input = PREFACE.to_vec();
        input.extend(Frame::header(MAX_FRAME + 1, 0x0, 0, 1));
        let mut out = Vec::new();
        assert!(matches!(
            relay_requests(input.as_slice(), &mut out).await,
            Err(ShimError::Frame(16_385))
        ));
        // Connected, then silent: cut off after FIRST_REQUEST, in paused time.
        tokio::time::pause();
        let (_client, server) = tokio::io::duplex(64);
        let mut out = Vec::new();
        assert!(matches!(
            relay_requests(server, &mut out).await,
            Err(ShimError::Slow)
        ));
    }

    #[test]
    fn valid_authorities_are_kept() {
        assert!(acceptable(b"localhost"));
        assert!(acceptable(b"[::1]:50051"));
        assert!(!acceptable(b"tmp%2Fnvhcd.sock"));
        assert!(!acceptable(b"/run/nvhcd.sock"));
        assert!(!acceptable(b""));
    }
}
