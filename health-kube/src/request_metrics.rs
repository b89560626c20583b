//! Every request a component's Kubernetes client sends, counted once in
//! `api_requests_total{verb,resource,code}` by a layer inside the
//! `kube::Client`: each page of a list, each watch (re)start, each get,
//! apply, patch and create, and each retry of kube's own retry policy,
//! under the names the API server's audit log gives them. Counting at the
//! call sites missed list pages and watches (issue 29).
//!
//! The stack of a counted client, outermost first: kube's retry policy for
//! 429/503/504 (moved out of kube's stack, where it would repeat a request
//! below this layer unseen), [`Counted`], then kube's own stack (base URI,
//! authentication, TLS, connections).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::{Request, Response};
use kube::client::retry::RetryPolicy;
use kube::client::ClientBuilder;
use tower::retry::{Retry, RetryLayer};
use tower::util::Either;
use tower::{Layer, Service, ServiceExt as _};

use crate::observer::Observer;

mod request_info;

pub use request_info::classify;

/// A counted client's service stack: kube's default stack counted, under
/// kube's retry policy when the configuration asks for it (the default).
pub type CountedStack = Either<Retry<RetryPolicy, Counted<KubeStack>>, Counted<KubeStack>>;

/// kube's default stack as `ClientBuilder::try_from` builds it.
pub type KubeStack = tower::util::BoxService<
    Request<kube::client::Body>,
    Response<Box<kube::client::DynBody>>,
    tower::BoxError,
>;

/// A client builder whose every request is counted on `observer`: for a
/// client that must be built later on another runtime (the node agent's
/// Event writer); [`client`] otherwise.
pub fn client_builder(
    mut config: kube::Config,
    observer: Arc<dyn Observer>,
) -> Result<ClientBuilder<CountedStack>, kube::Error> {
    let retry = std::mem::replace(&mut config.default_retry, false);
    let counted = CountLayer::new(observer);
    let retry = RetryEither(retry.then(|| RetryLayer::new(RetryPolicy::server_retry())));
    Ok(ClientBuilder::try_from(config)?
        .with_layer(&counted)
        .with_layer(&retry))
}

/// A client whose every request is counted on `observer`.
pub fn client(
    config: kube::Config,
    observer: Arc<dyn Observer>,
) -> Result<kube::Client, kube::Error> {
    Ok(client_builder(config, observer)?.build())
}

/// kube's retry layer when the configuration asks for it, else none.
struct RetryEither(Option<RetryLayer<RetryPolicy>>);

impl<S> Layer<S> for RetryEither {
    type Service = Either<Retry<RetryPolicy, S>, S>;

    fn layer(&self, inner: S) -> Self::Service {
        match &self.0 {
            Some(retry) => Either::Left(retry.layer(inner)),
            None => Either::Right(inner),
        }
    }
}

/// Puts [`Counted`] around a service.
#[derive(Clone)]
pub struct CountLayer {
    observer: Arc<dyn Observer>,
}

impl CountLayer {
    pub fn new(observer: Arc<dyn Observer>) -> Self {
        CountLayer { observer }
    }
}

impl<S> Layer<S> for CountLayer {
    type Service = Counted<S>;

    fn layer(&self, inner: S) -> Counted<S> {
        Counted {
            inner: Arc::new(tokio::sync::Mutex::new(inner)),
            observer: Arc::clone(&self.observer),
        }
    }
}

/// Counts each request once: with its HTTP status when the response head
/// arrives (a watch's too, while its body streams on), "error" when no
/// response came (refused connection, timeout, the caller gave up on it).
///
/// The inner service is shared, not cloned: kube's stack is a boxed
/// service that cannot be cloned, and the retry policy above needs a
/// service it can clone. The lock is held only to wait for readiness
/// (at once for kube's connection pool) and to hand the request over.
pub struct Counted<S> {
    inner: Arc<tokio::sync::Mutex<S>>,
    observer: Arc<dyn Observer>,
}

impl<S> Clone for Counted<S> {
    fn clone(&self) -> Self {
        Counted {
            inner: Arc::clone(&self.inner),
            observer: Arc::clone(&self.observer),
        }
    }
}

type CountedFuture<R, E> = Pin<Box<dyn Future<Output = Result<R, E>> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Counted<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = CountedFuture<Self::Response, Self::Error>;

    /// Always ready: the shared inner service's readiness is awaited in
    /// the call, under the lock, so no clone's readiness is taken by another.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        let (verb, resource) = classify(req.method(), path);
        let inner = Arc::clone(&self.inner);
        let observer = Arc::clone(&self.observer);
        Box::pin(async move {
            let mut pending = Pending {
                observer,
                verb,
                resource,
                done: false,
            };
            let sent = {
                let mut service = inner.lock().await;
                service.ready().await?.call(req)
            };
            let result = sent.await;
            pending.done(result.as_ref().ok().map(|r| r.status().as_u16()));
            result
        })
    }
}

/// A request not yet answered: counted as "error" if its future is
/// dropped before the response head arrives.
struct Pending {
    observer: Arc<dyn Observer>,
    verb: String,
    resource: String,
    done: bool,
}

impl Pending {
    fn done(&mut self, code: Option<u16>) {
        self.done = true;
        self.observer.api_request(&self.verb, &self.resource, code);
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.done {
            self.observer.api_request(&self.verb, &self.resource, None);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;
    use kube::client::Body;
    use serde_json::json;
    use tower_test::mock;

    use super::*;
    use crate::testing::{counted_client, next, respond};

    type Seen = Vec<(String, String, Option<u16>)>;

    #[derive(Default)]
    struct Requests(Mutex<Seen>);

    impl Observer for Requests {
        fn api_request(&self, verb: &str, resource: &str, code: Option<u16>) {
            self.0
                .lock()
                .expect("lock")
                .push((verb.to_string(), resource.to_string(), code));
        }
        fn event_written(&self, _type_: &str, _reason: &str) {}
        fn event_write_deferred(&self) {}
    }

    impl Requests {
        fn seen(&self) -> Seen {
            self.0.lock().expect("lock").clone()
        }
    }

    fn seen(verb: &str, resource: &str, code: Option<u16>) -> (String, String, Option<u16>) {
        (verb.to_string(), resource.to_string(), code)
    }

    fn get(uri: &str) -> Request<Body> {
        Request::get(uri).body(Body::empty()).expect("a request")
    }

    #[tokio::test]
    async fn each_request_is_counted_once_with_the_status_the_server_gave() {
        let requests = Arc::new(Requests::default());
        let (client, mut handle) = counted_client(requests.clone());
        let pods: kube::Api<Pod> = kube::Api::namespaced(client, "shop");
        let asked = tokio::spawn(async move { pods.get_opt("web-0").await });
        let (_, send) = next(&mut handle).await;
        respond(
            send,
            404,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "NotFound", "code": 404}),
        );
        assert!(asked
            .await
            .expect("joined")
            .expect("a 404 is None")
            .is_none());
        assert_eq!(requests.seen(), [seen("get", "pods", Some(404))]);
    }

    /// Counted when the head arrives: a watch's body may stream for
    /// minutes after.
    #[tokio::test]
    async fn a_watch_is_counted_when_its_response_starts() {
        let requests = Arc::new(Requests::default());
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let mut counted = CountLayer::new(requests.clone()).layer(service);
        let call = counted.call(get("/api/v1/pods?watch=true&resourceVersion=7"));
        let answer = tokio::spawn(async move {
            let (_, send) = handle.next_request().await.expect("a request");
            send.send_response(Response::new(Body::empty()));
            handle
        });
        let response = call.await.expect("a response");
        assert_eq!(requests.seen(), [seen("watch", "pods", Some(200))]);
        drop((response, answer.await));
    }

    #[tokio::test]
    async fn a_request_without_an_answer_is_an_error() {
        let requests = Arc::new(Requests::default());
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let mut counted = CountLayer::new(requests.clone()).layer(service);
        // Refused by the connection: an error, no status.
        let call = counted.call(get("/api/v1/nodes"));
        let refuse = async {
            let (_, send) = handle.next_request().await.expect("a request");
            send.send_error("connection refused");
        };
        let (refused, ()) = tokio::join!(call, refuse);
        assert!(refused.is_err());
        // Sent, and given up by the caller before any answer.
        let call = counted.call(get("/apis/coordination.k8s.io/v1/namespaces/csi/leases/l"));
        let gave_up = tokio::time::timeout(Duration::from_millis(50), call).await;
        assert!(gave_up.is_err(), "no answer came");
        let (request, _send) = handle.next_request().await.expect("it was sent");
        assert_eq!(
            request.uri().path(),
            "/apis/coordination.k8s.io/v1/namespaces/csi/leases/l"
        );
        assert_eq!(
            requests.seen(),
            [seen("list", "nodes", None), seen("get", "leases", None)]
        );
    }

    /// kube's retry policy sits above the counting layer: a 503 retried
    /// is two requests, as the server saw them.
    #[tokio::test]
    async fn each_retry_is_a_request() {
        let requests = Arc::new(Requests::default());
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let policy = RetryPolicy::new(Duration::from_millis(1), Duration::from_millis(5), 3, false)
            .expect("a policy");
        let mut stack =
            RetryLayer::new(policy).layer(CountLayer::new(requests.clone()).layer(service));
        let answer = tokio::spawn(async move {
            for code in [503, 200] {
                let (_, send) = handle.next_request().await.expect("a request");
                send.send_response(
                    Response::builder()
                        .status(code)
                        .body(Body::empty())
                        .expect("a response"),
                );
            }
            handle
        });
        let response = stack
            .ready()
            .await
            .expect("ready")
            .call(get("/api/v1/namespaces/shop/events"))
            .await
            .expect("answered");
        assert_eq!(response.status(), 200);
        assert_eq!(
            requests.seen(),
            [
                seen("list", "events", Some(503)),
                seen("list", "events", Some(200))
            ]
        );
        drop(answer.await);
    }
}
