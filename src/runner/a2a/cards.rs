//! The remote agents' cards, cached per card URL and bearer token so that a turn does not fetch
//! the card again: the crate's RFC 9111 resolver (`CachingCardResolver`) honours the card's own
//! `Cache-Control` / `ETag`, a card that says nothing stays fresh for [`KEPT_FOR`], and no
//! resolver is kept longer than that whatever the card says (a peer that changed its card is seen
//! within it). A run whose cached card led to an endpoint that is gone forgets it ([`forget`])
//! and reads the card afresh once.

use std::collections::HashMap;
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use a2a_protocol_client::discovery::{CachingCardResolver, CardFetchOptions};
use a2a_protocol_types::AgentCard;

/// The longest a card (and its resolver) is used before it is read again from scratch.
const KEPT_FOR: Duration = Duration::from_secs(300);

/// A card URL and the sha256 of the token it is fetched with: a card stored under one credential
/// is never used for another.
type Key = (String, Option<String>);

struct Entry {
    resolver: CachingCardResolver,
    since: Instant,
    /// The card was resolved at least once: what it names may be stale.
    resolved: bool,
}

static CARDS: LazyLock<Mutex<HashMap<Key, Entry>>> = LazyLock::new(Default::default);

/// The card at `url` fetched with `options` (whose `authorization` header `token` is), and whether
/// it may come from an earlier run's fetch (so a failure against it may mean it went stale).
pub(super) async fn card(
    url: &url::Url,
    token: Option<&str>,
    options: CardFetchOptions,
) -> Result<(AgentCard, bool), String> {
    let key = key(url, token);
    let (resolver, reused) = {
        let mut cards = CARDS.lock().expect("card cache");
        cards.retain(|_, e| e.since.elapsed() < KEPT_FOR);
        let entry = match cards.entry(key.clone()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(Entry { resolver: resolver(url, options)?, since: Instant::now(), resolved: false })
            }
        };
        (entry.resolver.clone(), entry.resolved)
    };
    let card = resolver.resolve().await.map_err(|e| format!("cannot read the remote agent's card at {url}: {e}"))?;
    if let Some(entry) = CARDS.lock().expect("card cache").get_mut(&key) {
        entry.resolved = true;
    }
    Ok((card, reused))
}

/// Drops the cached card at `url` for `token`: the next turn reads it afresh.
pub(super) fn forget(url: &url::Url, token: Option<&str>) {
    CARDS.lock().expect("card cache").remove(&key(url, token));
}

fn key(url: &url::Url, token: Option<&str>) -> Key {
    (url.as_str().to_string(), token.map(crate::store::sha256_hex))
}

/// A resolver of exactly `url`: the crate builds its URL from a base and a path, so the base is
/// the URL's origin and the path the rest of it (query included).
fn resolver(url: &url::Url, options: CardFetchOptions) -> Result<CachingCardResolver, String> {
    let base = &url[..url::Position::BeforePath];
    let path = &url[url::Position::BeforePath..];
    let resolver = CachingCardResolver::with_path(base, path)
        .map_err(|e| format!("cannot read the remote agent's card at {url}: {e}"))?;
    Ok(resolver.with_options(options).with_default_freshness(KEPT_FOR))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_card_is_kept_per_url_and_token_and_forgotten_on_demand() {
        let url = url::Url::parse("http://127.0.0.1:9/a/.well-known/agent-card.json?x=1").unwrap();
        assert_ne!(key(&url, Some("a")), key(&url, Some("b")));
        assert_ne!(key(&url, Some("a")), key(&url, None));
        assert!(!key(&url, Some("secret")).1.unwrap().contains("secret"), "the token is kept hashed");
        let r = resolver(&url, CardFetchOptions::default()).unwrap();
        assert!(format!("{r:?}").contains("http://127.0.0.1:9/a/.well-known/agent-card.json?x=1"), "{r:?}");
        CARDS.lock().unwrap().insert(key(&url, None), Entry { resolver: r, since: Instant::now(), resolved: true });
        forget(&url, None);
        assert!(!CARDS.lock().unwrap().contains_key(&key(&url, None)));
    }
}
