//! The state-of-the-world ADS server over a [`SnapshotCache`].
//!
//! One task per stream. It answers each request and, when the cache changes, pushes every
//! subscribed type whose version moved, in [`type_url::PUSH_ORDER`] (clusters first).
//!
//! ACK and NACK are told apart by `error_detail`, never by comparing versions: a request
//! answering our latest nonce with `error_detail` set is a NACK. The rejected version is
//! logged with Envoy's reason, counted, recorded in the status view, and then held: it is
//! not sent again on this stream until the snapshot changes (go-control-plane compared
//! versions and re-sent rejected configs in a loop, its issues 582 and 794). Envoy keeps
//! serving the last version it accepted. A request answering an older nonce is stale and
//! ignored, as the xDS protocol says.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::codec::{DecodeBuf, Decoder};
use tonic::codegen::{BoxFuture, Context, Poll, Service, StdError, http};
use tonic::server::NamedService;
use tonic::{Status, Streaming};

use crate::cache::{Resource, SnapshotCache, type_url};

/// Errors serving ADS.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("ADS server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// The ADS gRPC service, for a host that composes its own tonic server
/// (`Server::builder().add_service(service(cache))`).
pub fn service(cache: SnapshotCache) -> AdsService {
    AdsService { cache }
}

/// Serve ADS on `listener` until the process ends.
pub async fn serve(listener: TcpListener, cache: SnapshotCache) -> Result<(), ServeError> {
    serve_with_shutdown(listener, cache, std::future::pending()).await
}

/// Serve ADS on `listener` until `shutdown` completes; open streams are then closed.
pub async fn serve_with_shutdown(
    listener: TcpListener,
    cache: SnapshotCache,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    tonic::transport::Server::builder()
        // Find Envoys that vanished without closing their connection.
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(service(cache))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
        .await?;
    Ok(())
}

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";

/// `envoy.service.discovery.v3.AggregatedDiscoveryService`, state of the world only.
///
/// Written on tonic's transport and request decoding, with the response framing by hand
/// (see `ResponseBody`), so that a response of a wildcard type is encoded once per (type,
/// version) and shared by every stream, which adds only its nonce. Delta ADS answers
/// `unimplemented`.
#[derive(Debug, Clone)]
pub struct AdsService {
    cache: SnapshotCache,
}

impl NamedService for AdsService {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

impl<B> Service<http::Request<B>> for AdsService
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() != SOTW_PATH {
            return Box::pin(async move {
                Ok(Status::unimplemented(
                    "only state-of-the-world ADS (StreamAggregatedResources) is served",
                )
                .into_http())
            });
        }
        let cache = self.cache.clone();
        Box::pin(async move {
            // Envoy's NACK carries a reason; a whole-config NACK can be large.
            let mut requests =
                Streaming::new_request(AdsCodec, req.into_body(), None, Some(16 * 1024 * 1024));
            // The first request names the node; without an id there is nothing to serve.
            let first = match requests.message().await {
                Ok(Some(first)) => first,
                Ok(None) => {
                    return Ok(
                        Status::cancelled("stream closed before its first request").into_http()
                    );
                }
                Err(status) => return Ok(status.into_http()),
            };
            let Some(node) = first
                .node
                .as_ref()
                .map(|n| n.id.clone())
                .filter(|id| !id.is_empty())
            else {
                return Ok(
                    Status::invalid_argument("the first request must carry node.id").into_http(),
                );
            };
            let (tx, rx) = mpsc::channel(4);
            tokio::spawn(async move {
                cache.stream_opened(&node);
                let mut stream = StreamState::new(cache.clone(), node.clone(), tx);
                stream.run(first, requests).await;
                cache.stream_closed(&node);
            });
            let mut response = http::Response::new(tonic::body::Body::new(ResponseBody {
                rx,
                queued: std::collections::VecDeque::new(),
                done: false,
            }));
            response.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/grpc"),
            );
            Ok(response)
        })
    }
}

/// The response body: gRPC length-prefixed messages, each written as three chunks (the
/// prefix, the shared encoded body, this stream's nonce field) so no stream copies the
/// resources; then `grpc-status: 0` trailers when the stream task ends.
///
/// Written by hand rather than through tonic's encoder because tonic encodes every
/// message into a per-stream buffer that keeps the largest message's allocation for the
/// stream's life: 1,000 Envoys held 1,000 copies of the cluster set (docs/design/xds.md).
struct ResponseBody {
    rx: mpsc::Receiver<Outgoing>,
    queued: std::collections::VecDeque<Bytes>,
    done: bool,
}

impl http_body::Body for ResponseBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Status>>> {
        if let Some(chunk) = self.queued.pop_front() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(chunk))));
        }
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(out)) => {
                let mut nonce = Vec::new();
                prost::encoding::string::encode(5, &out.nonce, &mut nonce);
                let len = out.body.len() + nonce.len();
                let Ok(len) = u32::try_from(len) else {
                    self.done = true;
                    return Poll::Ready(Some(Err(Status::resource_exhausted(
                        "response larger than 4 GiB",
                    ))));
                };
                let mut prefix = Vec::with_capacity(5);
                prefix.push(0); // not compressed
                prefix.extend_from_slice(&len.to_be_bytes());
                self.queued
                    .push_back(Bytes::from_owner(SharedBody(out.body)));
                self.queued.push_back(Bytes::from(nonce));
                Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from(prefix)))))
            }
            Poll::Ready(None) => {
                self.done = true;
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// An encoded body shared between streams, viewed as bytes.
struct SharedBody(Arc<Vec<u8>>);

impl AsRef<[u8]> for SharedBody {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// A DiscoveryResponse on the wire: fields version_info, resources and type_url encoded
/// once (shared), then this stream's nonce.
#[derive(Debug, Clone)]
pub(crate) struct Outgoing {
    body: Arc<Vec<u8>>,
    nonce: String,
}

/// Encode fields 1 (version_info), 2 (resources) and 4 (type_url) of a DiscoveryResponse.
pub(crate) fn encode_body<'a>(
    version: &str,
    type_url: &str,
    resources: impl Iterator<Item = &'a Resource> + Clone,
) -> Vec<u8> {
    use prost::encoding::{message, string};
    let version = version.to_string();
    let type_url = type_url.to_string();
    let len = string::encoded_len(1, &version)
        + resources
            .clone()
            .map(|r| message::encoded_len(2, &r.body))
            .sum::<usize>()
        + string::encoded_len(4, &type_url);
    let mut out = Vec::with_capacity(len);
    string::encode(1, &version, &mut out);
    for r in resources {
        message::encode(2, &r.body, &mut out);
    }
    string::encode(4, &type_url, &mut out);
    out
}

/// Decodes requests with prost (responses are framed by [`ResponseBody`]).
#[derive(Debug, Clone, Copy, Default)]
struct AdsCodec;

impl Decoder for AdsCodec {
    type Item = DiscoveryRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<DiscoveryRequest>, Status> {
        DiscoveryRequest::decode(src)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("bad DiscoveryRequest: {e}")))
    }
}

/// What a stream subscribed to for one type.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Subscription {
    All,
    Names(BTreeSet<String>),
}

#[derive(Debug)]
struct TypeState {
    subscription: Subscription,
    /// The version and nonce of our latest response of this type.
    sent_version: Option<String>,
    nonce: String,
    /// A send is due: `Some(true)` answers even an unchanged version (new subscription).
    due: Option<bool>,
    /// Our latest response awaits its ACK or NACK.
    in_flight: bool,
}

/// How long a stream may hold its push permit waiting for ACKs before it lets go.
const ACK_WAIT: Duration = Duration::from_secs(5);

type Acquire = std::pin::Pin<
    Box<dyn Future<Output = Result<OwnedSemaphorePermit, tokio::sync::AcquireError>> + Send>,
>;

struct StreamState {
    cache: SnapshotCache,
    node: String,
    tx: mpsc::Sender<Outgoing>,
    types: HashMap<String, TypeState>,
    next_nonce: u64,
    /// Held from a push until every response of it is answered (or ACK_WAIT passes), so
    /// at most `push_limit` streams have a push in flight: on a change to 1,000 Envoys
    /// this bounds the encoded responses waiting in transport buffers.
    permit: Option<(OwnedSemaphorePermit, tokio::time::Instant)>,
}

impl StreamState {
    fn new(cache: SnapshotCache, node: String, tx: mpsc::Sender<Outgoing>) -> StreamState {
        StreamState {
            cache,
            node,
            tx,
            types: HashMap::new(),
            next_nonce: 0,
            permit: None,
        }
    }

    async fn run(&mut self, first: DiscoveryRequest, mut requests: Streaming<DiscoveryRequest>) {
        let mut changed = self.cache.subscribe();
        changed.mark_unchanged();
        self.handle(first);
        let mut acquiring: Option<Acquire> = None;
        loop {
            let due = self.types.values().any(|t| t.due.is_some());
            if due && self.permit.is_some() {
                if self.flush().await.is_err() {
                    return;
                }
            } else if due && acquiring.is_none() {
                acquiring = Some(Box::pin(self.cache.push_permits().acquire_owned()));
            }
            let held_until = self.permit.as_ref().map(|(_, until)| *until);
            tokio::select! {
                req = requests.message() => match req {
                    Ok(Some(req)) => self.handle(req),
                    Ok(None) => return,
                    Err(status) => {
                        tracing::debug!(node = %self.node, code = ?status.code(), "ADS stream ended");
                        return;
                    }
                },
                res = changed.changed() => {
                    if res.is_err() {
                        return;
                    }
                    for t in self.types.values_mut() {
                        t.due.get_or_insert(false);
                    }
                }
                // Polled only while acquiring (the branch's condition).
                permit = async {
                    match acquiring.as_mut() {
                        Some(acquire) => acquire.await,
                        None => std::future::pending().await,
                    }
                }, if acquiring.is_some() => {
                    acquiring = None;
                    let Ok(permit) = permit else { return };
                    self.permit = Some((permit, tokio::time::Instant::now() + ACK_WAIT));
                }
                _ = tokio::time::sleep_until(held_until.unwrap_or_else(tokio::time::Instant::now)), if held_until.is_some() => {
                    tracing::debug!(node = %self.node, "no ACK in time; push permit released");
                    self.release();
                }
            }
        }
    }

    /// Let the permit go and stop waiting for answers.
    fn release(&mut self) {
        self.permit = None;
        for t in self.types.values_mut() {
            t.in_flight = false;
        }
    }

    /// Take in one request: an ACK or NACK of our latest response, and/or a subscription.
    fn handle(&mut self, req: DiscoveryRequest) {
        let type_url = req.type_url.clone();
        if type_url.is_empty() {
            tracing::warn!(node = %self.node, "ADS request without type_url ignored");
            return;
        }
        let subscription = if type_url::is_wildcard(&type_url)
            && (req.resource_names.is_empty() || req.resource_names.iter().any(|n| n == "*"))
        {
            Subscription::All
        } else {
            Subscription::Names(req.resource_names.iter().cloned().collect())
        };
        let short = type_url::short(&type_url).to_string();

        let Some(state) = self.types.get_mut(&type_url) else {
            // First request of this type on this stream: answer with what we have.
            self.types.insert(
                type_url.clone(),
                TypeState {
                    subscription,
                    sent_version: None,
                    nonce: String::new(),
                    due: Some(true),
                    in_flight: false,
                },
            );
            return;
        };

        if !req.response_nonce.is_empty() {
            if req.response_nonce != state.nonce {
                self.cache.metrics().stale.inc();
                tracing::debug!(node = %self.node, type_url = %short, "stale nonce ignored");
                return;
            }
            state.in_flight = false;
            let sent = state.sent_version.clone().unwrap_or_default();
            match &req.error_detail {
                Some(err) => {
                    // Envoy's reason describes our resource; it holds no secrets of ours
                    // (resources carry credential references, never values).
                    tracing::warn!(
                        node = %self.node,
                        type_url = %short,
                        rejected = %sent,
                        serving = %req.version_info,
                        reason = %err.message,
                        "Envoy rejected a config; holding until the snapshot changes"
                    );
                    self.cache
                        .record_nack(&self.node, &type_url, &sent, &err.message);
                }
                None => {
                    tracing::debug!(node = %self.node, type_url = %short, version = %req.version_info, "ACK");
                    self.cache
                        .record_ack(&self.node, &type_url, &req.version_info);
                }
            }
        }

        if state.subscription != subscription {
            state.subscription = subscription;
            state.due = Some(true);
        }
        if self.types.values().all(|t| !t.in_flight) {
            self.permit = None;
        }
    }

    /// Send every due type, clusters first (type_url::PUSH_ORDER), under the held permit.
    async fn flush(&mut self) -> Result<(), Closed> {
        let mut order: Vec<String> = type_url::PUSH_ORDER
            .iter()
            .filter(|t| self.types.contains_key(**t))
            .map(|t| t.to_string())
            .collect();
        let mut others: Vec<String> = self
            .types
            .keys()
            .filter(|t| !type_url::PUSH_ORDER.contains(&t.as_str()))
            .cloned()
            .collect();
        others.sort();
        order.extend(others);
        for t in order {
            let Some(force) = self.types.get_mut(&t).and_then(|s| s.due.take()) else {
                continue;
            };
            self.send(&t, force).await?;
        }
        if self.types.values().all(|t| !t.in_flight) {
            self.permit = None;
        }
        Ok(())
    }

    /// Send the current resources of `type_url` if its version differs from the last one
    /// sent (or always, with `force`: a new subscription needs an answer).
    async fn send(&mut self, type_url: &str, force: bool) -> Result<(), Closed> {
        let Some(snapshot) = self.cache.snapshot_for(&self.node) else {
            return Ok(()); // Nothing set yet: Envoy waits, and we push on the first set.
        };
        let Some(state) = self.types.get_mut(type_url) else {
            return Ok(());
        };
        let set = snapshot.get(type_url);
        if !force && state.sent_version.as_deref() == Some(set.version.as_str()) {
            return Ok(());
        }
        let body = match &state.subscription {
            Subscription::All => set.wire_body(type_url),
            Subscription::Names(names) => {
                let wanted = set.resources.iter().filter(|r| names.contains(&r.name));
                // A named subscription with nothing to offer yet gets no answer: an
                // empty response would tell Envoy the resource does not exist.
                if wanted.clone().next().is_none() {
                    return Ok(());
                }
                Arc::new(encode_body(&set.version, type_url, wanted))
            }
        };
        self.next_nonce += 1;
        let nonce = self.next_nonce.to_string();
        state.sent_version = Some(set.version.clone());
        state.nonce = nonce.clone();
        state.in_flight = true;
        let response = Outgoing { body, nonce };
        self.tx.send(response).await.map_err(|_| Closed)?;
        self.cache.record_sent(&self.node, type_url, &set.version);
        tracing::debug!(node = %self.node, type_url = %type_url::short(type_url), version = %set.version, "pushed");
        Ok(())
    }
}

/// The response channel is closed: the client went away.
struct Closed;
