//! kube-rs's own testing approach, for the tests of this and other crates
//! (feature `testing`): a [`kube::Client`] over tower-test's mock service,
//! so that a test sees each exact request the code makes and chooses the
//! answer.
//!
//! Two ways to answer:
//! - step by step: [`client`], then [`next`] takes each request in turn and
//!   [`respond`] answers it (a request that never comes fails the test);
//! - all of them: [`MockApi::start`] answers every request from a function
//!   of it and records them for [`MockApi::take`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response};
use kube::client::Body;
use serde_json::Value;
use tower_test::mock::{self, Handle, SendResponse};

/// The test's end of the mock service: where the client's requests arrive.
pub type MockHandle = Handle<Request<Body>, Response<Body>>;

/// Where the answer to one request goes.
pub type Responder = SendResponse<Response<Body>>;

/// One request as the mock API server got it.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiRequest {
    pub method: Method,
    /// Path and query, as the client sent them.
    pub uri: String,
    pub content_type: Option<String>,
    /// The JSON body; `Null` when there is none.
    pub body: Value,
}

impl ApiRequest {
    async fn read(req: Request<Body>) -> ApiRequest {
        let method = req.method().clone();
        let uri = req.uri().to_string();
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or_default().to_string());
        let bytes = req.into_body().collect_bytes().await.expect("a body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON body")
        };
        ApiRequest {
            method,
            uri,
            content_type,
            body,
        }
    }
}

/// A client whose every request the test answers through the handle.
pub fn client() -> (kube::Client, MockHandle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    (kube::Client::new(service, "default"), handle)
}

/// [`client`] with the counting layer of the real clients
/// (`crate::request_metrics`): every request is reported to `observer`.
pub fn counted_client(observer: Arc<dyn crate::observer::Observer>) -> (kube::Client, MockHandle) {
    use tower::Layer as _;
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let service = crate::request_metrics::CountLayer::new(observer).layer(service);
    (kube::Client::new(service, "default"), handle)
}

/// The next request, which must come within 5 s, and where its answer goes.
pub async fn next(handle: &mut MockHandle) -> (ApiRequest, Responder) {
    let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("a request within 5 s")
        .expect("the client is still there");
    (ApiRequest::read(req).await, send)
}

/// Answers a request with `code` and a JSON body.
pub fn respond(send: Responder, code: u16, body: &Value) {
    send.send_response(
        Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("a response"),
    );
}

/// A mock API server answering every request in a task of its own; it stops
/// when dropped.
pub struct MockApi {
    seen: Arc<Mutex<Vec<ApiRequest>>>,
    task: tokio::task::JoinHandle<()>,
}

impl MockApi {
    /// Answers each request with `answer(request)` (status code and JSON
    /// body), recording the request first. Needs a tokio runtime.
    pub fn start(
        mut answer: impl FnMut(&ApiRequest) -> (u16, Value) + Send + 'static,
    ) -> (kube::Client, MockApi) {
        let (client, mut handle) = client();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = Arc::clone(&seen);
        let task = tokio::spawn(async move {
            while let Some((req, send)) = handle.next_request().await {
                let req = ApiRequest::read(req).await;
                let (code, reply) = answer(&req);
                log.lock().expect("the log").push(req);
                respond(send, code, &reply);
            }
        });
        (client, MockApi { seen, task })
    }

    /// The requests since the last call.
    pub fn take(&self) -> Vec<ApiRequest> {
        std::mem::take(&mut *self.seen.lock().expect("the log"))
    }

    /// The requests since the last [`MockApi::take`], left in place.
    pub fn seen(&self) -> Vec<ApiRequest> {
        self.seen.lock().expect("the log").clone()
    }
}

impl Drop for MockApi {
    fn drop(&mut self) {
        self.task.abort();
    }
}
