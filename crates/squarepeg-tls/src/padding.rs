//! Padding records for inconsistent retransmissions over numbered records (Hollywood §4.2,
//! docs/wire.md §5.1).
//!
//! When the userspace TCP retransmits a range whose messages will arrive too late, it sends
//! live messages in their place (whole records moved or copied there, never re-sealed) and
//! fills what is left of the range with padding. Under TLS that padding must be records too:
//! a receiver reads the stream record by record and opens everything it reads. A padding
//! record is an ordinary numbered application-data record with no content, its length made
//! up with TLS 1.3's own zero padding (RFC 8446 §5.4), so it looks like any other record.
//!
//! The TCP's send queue asks for padding at the moment it replaces, outside [`crate::Tls`],
//! so the padding is sealed from numbers the [`crate::Tls`] reserved for it ahead of time
//! (skipped in its own sequence): a number is never sealed twice under one key, whichever of
//! the two seals first (issue: a replacement must never reuse a nonce, since the original
//! record may still arrive). Reserved numbers are renewed before they fall out of the
//! receiver's replay window.
//!
//! Key updates: the padding goes into a range sent earlier, which may lie before the
//! sender's last KeyUpdate in the stream, where the receiver still reads under the key before
//! it. So padding is sealed under the previous key while numbers reserved under it remain:
//! a receiver of numbered records keeps the key before its last KeyUpdate (docs/wire.md §5),
//! which opens such a record on either side of the KeyUpdate.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::record::{self, HEADER_LEN, MAX_INNER_PLAINTEXT_LEN, RecordKeys, TAG_LEN};
use crate::unordered::{NUMBER_PREFIX_LEN, encode_prefix};

/// The shortest padding record: header, number prefix, content type, tag.
pub const MIN_PADDING_LEN: usize = HEADER_LEN + NUMBER_PREFIX_LEN + 1 + TAG_LEN;
/// The longest: the inner plaintext at its limit.
const MAX_PADDING_RECORD_LEN: usize = HEADER_LEN + MAX_INNER_PLAINTEXT_LEN + TAG_LEN;
/// Numbers reserved at a time.
pub(crate) const RESERVED_NUMBERS: u64 = 32;
/// Reserved numbers this many records behind the send sequence are renewed: well inside the
/// receiver's replay window ([`crate::unordered::REPLAY_WINDOW`]).
pub(crate) const RENEW_AFTER: u64 = 4 * 1024;
/// Replaced ranges waiting for the layer above to announce them, at most.
const MAX_REPLACED_RANGES: usize = 1024;

/// Numbers reserved under one key.
struct Reserve {
    keys: Arc<RecordKeys>,
    epoch: u64,
    numbers: Range<u64>,
}

#[derive(Default)]
struct State {
    /// Set once a padder exists: the [`crate::Tls`] reserves numbers from then on.
    wanted: bool,
    current: Option<Reserve>,
    /// Numbers left under the key before the last KeyUpdate.
    previous: Option<Reserve>,
    /// Ranges replaced, for the layer above to announce (oldest first).
    replaced: VecDeque<Range<u64>>,
    stats: PaddingStats,
    nonces: Option<Vec<(u64, [u8; 12])>>,
}

/// What the padder did (reported in [`crate::TlsStats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PaddingStats {
    /// Padding records sealed.
    pub records: u64,
    /// Bytes of padding records.
    pub bytes: u64,
    /// Replacements declined: too few reserved numbers, or too many ranges not yet taken
    /// for announcing.
    pub declined: u64,
}

/// Seals padding records for a connection's TCP send queue (see the module documentation);
/// shared with the [`crate::Tls`] that reserves its numbers. Cheap to clone.
#[derive(Clone, Default)]
pub struct PaddingSealer(Arc<Mutex<State>>);

impl std::fmt::Debug for PaddingSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaddingSealer").finish_non_exhaustive()
    }
}

impl PaddingSealer {
    fn state(&self) -> MutexGuard<'_, State> {
        // The state stays consistent across a panic elsewhere: every update is one statement.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends exactly `len` bytes of padding records for the end of the replaced stream
    /// range `range` (nothing for 0), and keeps the range for [`crate::Tls::take_replaced`].
    /// Returns false, appending nothing, when it cannot: `len` below [`MIN_PADDING_LEN`],
    /// or too few reserved numbers (the range is then retransmitted as it was).
    pub fn pad(&self, range: Range<u64>, len: usize, out: &mut Vec<u8>) -> bool {
        let mut state = self.state();
        if state.replaced.len() >= MAX_REPLACED_RANGES {
            // The receiver must hear of every range: none replaced until these are taken.
            state.stats.declined += 1;
            return false;
        }
        let records = if len == 0 {
            0
        } else if len < MIN_PADDING_LEN {
            return false;
        } else {
            len.div_ceil(MAX_PADDING_RECORD_LEN) as u64
        };
        let State {
            current,
            previous,
            stats,
            nonces,
            ..
        } = &mut *state;
        let reserve = [previous.as_mut(), current.as_mut()]
            .into_iter()
            .flatten()
            .find(|r| r.numbers.end - r.numbers.start >= records);
        let Some(reserve) = reserve else {
            stats.declined += 1;
            return false;
        };
        // Equal shares, each at least MIN_PADDING_LEN since len >= records * MIN_PADDING_LEN.
        let count = records as usize;
        for i in 0..count {
            let share = len / count + usize::from(i < len % count);
            let seq = reserve.numbers.start;
            reserve.numbers.start += 1;
            if let Some(nonces) = nonces {
                nonces.push((reserve.epoch, reserve.keys.nonce(seq)));
            }
            let prefix = encode_prefix(seq, 0);
            let zeros = share - MIN_PADDING_LEN;
            reserve.keys.seal_prefixed(
                seq,
                record::content_type::APPLICATION_DATA,
                &prefix,
                &[],
                zeros,
                out,
            );
            stats.records += 1;
            stats.bytes += share as u64;
        }
        state.replaced.push_back(range);
        true
    }

    /// Whether the [`crate::Tls`] should keep numbers reserved.
    pub(crate) fn wanted(&self) -> bool {
        self.state().wanted
    }

    pub(crate) fn set_wanted(&self) {
        self.state().wanted = true;
    }

    /// Whether the reserve under `epoch` needs renewing at send sequence `seq`.
    pub(crate) fn needs_numbers(&self, epoch: u64, seq: u64) -> bool {
        let state = self.state();
        match &state.current {
            Some(r) => {
                r.epoch != epoch
                    || r.numbers.is_empty()
                    || r.numbers.start.saturating_add(RENEW_AFTER) < seq
            }
            None => true,
        }
    }

    /// Numbers `numbers` under `keys` (key epoch `epoch`) replace the current reserve.
    pub(crate) fn reserve(&self, keys: Arc<RecordKeys>, epoch: u64, numbers: Range<u64>) {
        self.state().current = Some(Reserve {
            keys,
            epoch,
            numbers,
        });
    }

    /// The send key changed: what is left of the current reserve becomes the previous one.
    pub(crate) fn key_updated(&self) {
        let mut state = self.state();
        state.previous = state.current.take();
    }

    pub(crate) fn take_replaced(&self) -> Vec<Range<u64>> {
        self.state().replaced.drain(..).collect()
    }

    pub(crate) fn stats(&self) -> PaddingStats {
        self.state().stats
    }

    pub(crate) fn record_nonces(&self, on: bool) {
        let mut state = self.state();
        state.nonces = on.then(|| state.nonces.take().unwrap_or_default());
    }

    pub(crate) fn sealed_nonces(&self) -> Vec<(u64, [u8; 12])> {
        self.state().nonces.clone().unwrap_or_default()
    }
}
