//! A list walked page by page (`limit` and `continue`), each page bounded in
//! time: what the agent reads once at start (its Events, its
//! `VolumeHealth` entries) and the controller's pod list of a down node.

use std::time::Duration;

use kube::api::ListParams;
use kube::Api;
use serde::de::DeserializeOwned;

/// Why a paged list stopped.
#[derive(Debug, thiserror::Error)]
pub enum PageError {
    #[error(transparent)]
    Api(#[from] kube::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

impl PageError {
    /// The HTTP status, if the server answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            PageError::Api(kube::Error::Api(s)) => Some(s.code),
            _ => None,
        }
    }
}

/// Hands each page's items to `each`, in order, until the server says there
/// is no more; each page must come within `timeout`.
pub async fn list_pages<K>(
    api: &Api<K>,
    mut params: ListParams,
    timeout: Duration,
    mut each: impl FnMut(Vec<K>),
) -> Result<(), PageError>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    loop {
        let page = tokio::time::timeout(timeout, api.list(&params))
            .await
            .map_err(|_| PageError::Timeout(timeout))??;
        each(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(()),
        }
    }
}
