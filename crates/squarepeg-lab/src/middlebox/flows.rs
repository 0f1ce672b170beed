//! A bounded per-flow state table shared by the stateful transforms.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::packet::FlowKey;

/// Per-flow state with a bound on the number of flows. When full, entries idle for at least
/// `idle_timeout` are evicted; if none are, the new flow is not tracked (the caller passes its
/// packets unchanged and counts it). A `BTreeMap` keeps every iteration deterministic.
#[derive(Debug, Clone)]
pub(crate) struct FlowTable<V> {
    entries: BTreeMap<FlowKey, (Instant, V)>,
    max_flows: usize,
    idle_timeout: Duration,
}

impl<V> FlowTable<V> {
    pub fn new(max_flows: usize, idle_timeout: Duration) -> Self {
        Self {
            entries: BTreeMap::new(),
            max_flows,
            idle_timeout,
        }
    }

    pub fn get_mut(&mut self, key: &FlowKey, now: Instant) -> Option<&mut V> {
        let (seen, value) = self.entries.get_mut(key)?;
        *seen = (*seen).max(now);
        Some(value)
    }

    pub fn contains(&self, key: &FlowKey) -> bool {
        self.entries.contains_key(key)
    }

    /// Inserts (or replaces) state for `key`; returns false if the table is full of active
    /// flows.
    pub fn insert(&mut self, key: FlowKey, now: Instant, value: V) -> bool {
        if !self.entries.contains_key(&key) && self.entries.len() >= self.max_flows {
            let idle = self.idle_timeout;
            self.entries
                .retain(|_, (seen, _)| now.saturating_duration_since(*seen) < idle);
            if self.entries.len() >= self.max_flows {
                return false;
            }
        }
        self.entries.insert(key, (now, value));
        true
    }

    pub fn remove(&mut self, key: &FlowKey) -> Option<V> {
        self.entries.remove(key).map(|(_, v)| v)
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    fn key(port: u16) -> FlowKey {
        let a = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
        FlowKey {
            src: a,
            dst: a,
            src_port: port,
            dst_port: 1,
        }
    }

    #[test]
    fn bounded_with_idle_eviction() {
        let t0 = Instant::now();
        let mut table = FlowTable::new(2, Duration::from_secs(10));
        assert!(table.insert(key(1), t0, 1));
        assert!(table.insert(key(2), t0 + Duration::from_secs(5), 2));
        // Full and nobody idle long enough.
        assert!(!table.insert(key(3), t0 + Duration::from_secs(6), 3));
        // Flow 1 has been idle 10 s: evicted to make room.
        assert!(table.insert(key(3), t0 + Duration::from_secs(10), 3));
        assert!(!table.contains(&key(1)));
        assert!(table.contains(&key(2)) && table.contains(&key(3)));
        assert_eq!(
            table.get_mut(&key(2), t0 + Duration::from_secs(11)),
            Some(&mut 2)
        );
    }
}
