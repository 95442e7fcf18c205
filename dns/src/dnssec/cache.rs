//! The signature cache: a signature is made once per distinct RRset, key and validity window,
//! not per query. The key is what the signature covers (the RRSIG's fields, with the key tag,
//! algorithm and window, then the RRset in canonical form: owner, type, class, TTL, RDATA), so
//! an entry is found only by the very bytes it signs.
//!
//! Bounded: a fixed number of entries over 16 shards, each shard two generations (a young map
//! filled until it holds half the shard's share, then made the old one, the old one dropped;
//! a hit in the old generation moves the entry to the young one). So it holds at most its
//! capacity, keeps what is used, and evicts in O(1). Its maps hash with `RandomState` (SipHash,
//! keyed per process): the names answered come from clients. A window's entries age out once
//! the window moves (`sign::Validity::window`).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

const SHARDS: usize = 16;

/// The smallest and largest capacities (`dnssec_cache_entries`).
pub const CACHE_ENTRIES: std::ops::RangeInclusive<usize> = 64..=16_777_216;

#[derive(Default)]
struct Shard {
    young: HashMap<Box<[u8]>, Box<[u8]>, RandomState>,
    old: HashMap<Box<[u8]>, Box<[u8]>, RandomState>,
}

pub struct SignatureCache {
    shards: Box<[Mutex<Shard>]>,
    hasher: RandomState,
    /// Entries of a generation (half a shard's share).
    generation: usize,
    hits: AtomicU64,
    misses: AtomicU64,
    hit_counter: metrics::Counter,
    miss_counter: metrics::Counter,
}

impl SignatureCache {
    /// A cache of at most `entries` signatures (clamped to [`CACHE_ENTRIES`]).
    pub fn new(entries: usize) -> SignatureCache {
        let entries = entries.clamp(*CACHE_ENTRIES.start(), *CACHE_ENTRIES.end());
        let hasher = RandomState::new();
        let shards = (0..SHARDS)
            .map(|_| {
                Mutex::new(Shard {
                    young: HashMap::with_hasher(hasher.clone()),
                    old: HashMap::with_hasher(hasher.clone()),
                })
            })
            .collect();
        let counter = |cache: &'static str| metrics::counter!("cdnmap_dns_dnssec_signatures_total", "cache" => cache);
        let (hit_counter, miss_counter) = (counter("hit"), counter("miss"));
        hit_counter.increment(0);
        miss_counter.increment(0);
        SignatureCache {
            shards,
            hasher,
            generation: (entries / SHARDS / 2).max(1),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            hit_counter,
            miss_counter,
        }
    }

    /// The signature of `signed` (what it covers), from the cache or made by `sign` (outside
    /// the shard's lock) and kept. `None` when `sign` fails.
    pub fn get_or_sign(
        &self,
        signed: &[u8],
        sign: impl FnOnce() -> Option<Vec<u8>>,
    ) -> Option<Vec<u8>> {
        let shard = &self.shards[(self.hasher.hash_one(signed) as usize) % SHARDS];
        if let Some(found) = self.lookup(shard, signed) {
            self.hits.fetch_add(1, Ordering::Relaxed);
            self.hit_counter.increment(1);
            return Some(found);
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        self.miss_counter.increment(1);
        let signature = sign()?;
        if let Ok(mut s) = shard.lock() {
            self.insert(&mut s, signed.into(), signature.clone().into());
        }
        Some(signature)
    }

    fn lookup(&self, shard: &Mutex<Shard>, signed: &[u8]) -> Option<Vec<u8>> {
        let mut s = shard.lock().ok()?;
        if let Some(sig) = s.young.get(signed) {
            return Some(sig.to_vec());
        }
        let (key, sig) = s.old.remove_entry(signed)?;
        let out = sig.to_vec();
        self.insert(&mut s, key, sig);
        Some(out)
    }

    fn insert(&self, s: &mut Shard, key: Box<[u8]>, sig: Box<[u8]>) {
        if s.young.len() >= self.generation {
            s.old = std::mem::replace(&mut s.young, HashMap::with_hasher(self.hasher.clone()));
        }
        s.young.insert(key, sig);
    }

    /// Drops every entry (new keys: a key of the same tag and algorithm as one before must
    /// not be answered with the old one's signatures).
    pub fn clear(&self) {
        for shard in self.shards.iter() {
            if let Ok(mut s) = shard.lock() {
                s.young.clear();
                s.old.clear();
            }
        }
    }

    /// Signatures found and made so far.
    pub fn stats(&self) -> (u64, u64) {
        (
            self.hits.load(Ordering::Relaxed),
            self.misses.load(Ordering::Relaxed),
        )
    }

    /// Entries held now.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .filter_map(|s| s.lock().ok().map(|s| s.young.len() + s.old.len()))
            .sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The most entries it holds.
    pub fn capacity(&self) -> usize {
        self.generation * 2 * SHARDS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A signature is made once per content; the cache never holds more than its capacity, and
    /// an entry used often survives a flood of others.
    #[test]
    fn signs_once_per_content_and_stays_bounded() {
        let cache = SignatureCache::new(1024);
        let made = std::cell::Cell::new(0);
        let sign = |b: &[u8]| {
            made.set(made.get() + 1);
            Some(b.iter().rev().copied().collect::<Vec<u8>>())
        };
        let hot = b"hot rrset".to_vec();
        for i in 0..20_000u32 {
            let cold = i.to_be_bytes();
            assert_eq!(
                cache.get_or_sign(&cold, || sign(&cold)),
                Some(cold.iter().rev().copied().collect())
            );
            assert_eq!(
                cache.get_or_sign(&hot, || sign(&hot)).as_deref(),
                Some(&b"tesrr toh"[..])
            );
            assert!(cache.len() <= cache.capacity(), "bounded");
        }
        assert_eq!(cache.capacity(), 1024);
        assert_eq!(made.get(), 20_001, "the hot RRset signed once");
        assert_eq!(cache.stats(), (19_999, 20_001));
        assert_eq!(
            cache.get_or_sign(b"x", || None),
            None,
            "a failed signature is not kept"
        );
        assert_eq!(cache.get_or_sign(b"x", || Some(vec![1])), Some(vec![1]));
        cache.clear();
        assert!(cache.is_empty());
        assert_eq!(cache.get_or_sign(b"x", || Some(vec![2])), Some(vec![2]));
    }
}
