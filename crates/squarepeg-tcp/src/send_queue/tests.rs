use super::*;

fn read_all(q: &mut SendQueue) -> Vec<u8> {
    let mut out = vec![0; (q.end() - q.una()) as usize];
    let una = q.una();
    q.copy_out(una, &mut out);
    out
}

/// Commits and "transmits" everything pending, as segments would.
fn send_all(q: &mut SendQueue) {
    let from = q.committed_end();
    let mut out = vec![0; (q.end() - from) as usize];
    q.copy_out(from, &mut out);
}

/// A padder that writes '.' bytes, so tests can see where padding went.
fn dots(n: usize, out: &mut Vec<u8>) {
    out.resize(out.len() + n, b'.');
}

fn wrong_length(n: usize, out: &mut Vec<u8>) {
    out.resize(out.len() + n + 1, b'!');
}

fn msg(id: u64, deadline: Option<Instant>) -> WriteTag {
    WriteTag {
        message_id: Some(id),
        deadline,
        ..Default::default()
    }
}

fn reports(q: &mut SendQueue) -> Vec<MessageReport> {
    std::iter::from_fn(|| q.poll_report()).collect()
}

/// The reports other than `Sent` (reading the queue's bytes in a test sends them).
fn drops(q: &mut SendQueue) -> Vec<MessageReport> {
    reports(q)
        .into_iter()
        .filter(|r| !matches!(r, MessageReport::Sent { .. }))
        .collect()
}

/// Message `id`, depending on message `on`.
fn dep(id: u64, on: Option<u64>, deadline: Option<Instant>) -> WriteTag {
    WriteTag {
        message_id: Some(id),
        depends_on: on,
        deadline,
        ..Default::default()
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn plain_appends_pack_across_writes() {
    let mut q = SendQueue::new(1000, true);
    assert_eq!(q.push(b"hello ", WriteTag::default()), 6);
    assert_eq!(q.push(b"world", WriteTag::default()), 5);
    assert_eq!(q.segment_len(0, 100, false), 11);
    let mut seg = [0u8; 8];
    q.copy_out(0, &mut seg);
    assert_eq!(&seg, b"hello wo");
    assert_eq!(q.committed_end(), 11);
    q.ack(8);
    assert_eq!(q.len(), 3);
    assert_eq!(read_all(&mut q), b"rld");
    q.check_invariants();
}

#[test]
fn limit_and_partial_push() {
    let mut q = SendQueue::new(4, true);
    assert_eq!(q.push(b"abcdef", WriteTag::default()), 4);
    assert_eq!(q.push(b"x", WriteTag::default()), 0);
    assert_eq!(q.free(), 0);
    let now = Instant::now();
    assert_eq!(
        q.insert_message(now, b"m", WriteTag::default(), None),
        Err(Error::WouldBlock)
    );
    assert_eq!(
        q.insert_message(now, b"", WriteTag::default(), None),
        Err(Error::EmptyMessage)
    );
}

#[test]
fn consistent_segmentation_stops_at_write_boundaries() {
    let mut q = SendQueue::new(1000, false);
    q.push(b"aaa", WriteTag::default());
    q.push(b"bbbbb", WriteTag::default());
    assert_eq!(q.segment_len(0, 100, true), 3);
    assert_eq!(q.segment_len(3, 100, true), 5);
    assert_eq!(q.segment_len(4, 2, true), 2);
    assert_eq!(q.segment_len(0, 100, false), 8);
}

#[test]
fn messages_start_and_end_segments_even_without_consistent_segmentation() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, true);
    q.push(b"bytes", WriteTag::default());
    q.insert_message(now, b"MSG1", WriteTag::default(), None)
        .unwrap();
    q.insert_message(now, b"MSG22", WriteTag::default(), None)
        .unwrap();
    q.push(b"more", WriteTag::default());
    q.push(b"tail", WriteTag::default());
    // Bytes stop where a message begins; each message is a segment; bytes after it pack.
    assert_eq!(q.segment_len(0, 100, false), 5);
    assert_eq!(q.segment_len(5, 100, false), 4);
    assert_eq!(q.segment_len(9, 100, false), 5);
    assert_eq!(q.segment_len(14, 100, false), 8);
    assert_eq!(q.message_at(5), Some(4));
    assert_eq!(q.message_at(9), Some(5));
    assert_eq!(q.message_at(0), None);
    assert_eq!(q.message_at(6), None);
    // A message larger than the segment is cut at the segment size, from its start.
    let mut q = SendQueue::new(1000, false);
    q.insert_message(now, &[7; 10], WriteTag::default(), None)
        .unwrap();
    assert_eq!(q.segment_len(0, 4, false), 4);
    assert_eq!(q.segment_len(4, 100, false), 6);
}

#[test]
fn priority_insert_never_passes_committed_data() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    let low = WriteTag::default();
    let high = WriteTag {
        priority: 5,
        ..Default::default()
    };
    q.push(b"LOW1", low);
    q.push(b"LOW2", low);
    // Transmit one byte of LOW1: it becomes committed.
    let mut one = [0u8; 1];
    q.copy_out(0, &mut one);
    q.insert_message(now, b"HI", high, None).unwrap();
    assert_eq!(read_all(&mut q), b"LOW1HILOW2");
    q.check_invariants();
}

#[test]
fn priority_insert_orders_pending_messages() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    let p = |priority| WriteTag {
        priority,
        ..Default::default()
    };
    q.insert_message(now, b"a0", p(0), None).unwrap();
    q.insert_message(now, b"b5", p(5), None).unwrap();
    q.insert_message(now, b"c1", p(1), None).unwrap();
    q.insert_message(now, b"d5", p(5), None).unwrap();
    q.insert_message(now, b"e-1", p(-1), None).unwrap();
    // Higher first, FIFO among equals.
    assert_eq!(read_all(&mut q), b"b5d5c1a0e-1");
}

#[test]
fn squash_removes_only_untransmitted_writes_and_reports() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    let tag = |id| WriteTag {
        squash_key: Some(7),
        message_id: Some(id),
        ..Default::default()
    };
    q.insert_message(now, b"old1", tag(1), None).unwrap();
    let mut one = [0u8; 1];
    q.copy_out(0, &mut one);
    q.insert_message(now, b"old2", tag(2), None).unwrap();
    q.push(b"other", WriteTag::default());
    // A new write with the key squashes old2 (not old1, partly sent).
    q.insert_message(now, b"new3", tag(3), None).unwrap();
    assert_eq!(read_all(&mut q), b"old1othernew3");
    assert_eq!(
        reports(&mut q),
        vec![
            MessageReport::Sent {
                id: 1,
                replacement: false
            },
            MessageReport::Squashed { id: 2 },
            MessageReport::Sent {
                id: 3,
                replacement: false
            },
        ]
    );
    assert_eq!(q.stats().messages_squashed, 1);
}

#[test]
fn squash_fits_the_new_write_into_the_room_it_frees() {
    let now = Instant::now();
    let mut q = SendQueue::new(10, false);
    let tag = WriteTag {
        squash_key: Some(1),
        ..Default::default()
    };
    q.insert_message(now, &[1; 8], tag, None).unwrap();
    // 8 of 10 used; a new 8-byte update fits because it squashes the old one.
    q.insert_message(now, &[2; 8], tag, None).unwrap();
    assert_eq!(read_all(&mut q), vec![2; 8]);
}

#[test]
fn squash_keeps_a_write_a_live_message_depends_on() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    let key = |id, depends_on| WriteTag {
        squash_key: Some(1),
        message_id: Some(id),
        depends_on,
        deadline: Some(now + ms(100)),
        ..Default::default()
    };
    q.insert_message(now, b"base", key(1, None), None).unwrap();
    q.insert_message(now, b"delta", msg(2, Some(now + ms(100))), None)
        .unwrap();
    // Message 2 does not depend on 1, so a new keyed write squashes 1...
    q.insert_message(now, b"base2", key(3, None), None).unwrap();
    // ...but message 4 depends on 3, so 3 survives the next squash.
    q.insert_message(
        now,
        b"d4",
        WriteTag {
            message_id: Some(4),
            depends_on: Some(3),
            deadline: Some(now + ms(50)),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    q.insert_message(now, b"base5", key(5, None), None).unwrap();
    let order: Vec<usize> = q.pending_writes().map(|(n, _)| n).collect();
    assert_eq!(order, vec![5, 5, 2, 5], "delta, base2, d4, base5");
    // Once its dependent is past its deadline, squash may take it.
    assert_eq!(q.squash(now + ms(60), 1), 10);
    assert_eq!(read_all(&mut q), b"deltad4");
}

#[test]
fn expired_pending_messages_are_dropped_and_reported() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    q.insert_message(now, b"soon", msg(1, Some(now + ms(10))), None)
        .unwrap();
    q.insert_message(now, b"late", msg(2, Some(now + ms(50))), None)
        .unwrap();
    q.insert_message(now, b"never", msg(3, None), None).unwrap();
    assert_eq!(q.next_expiry(), Some(now + ms(10)));
    assert_eq!(q.expire(now + ms(9)), 0);
    assert_eq!(q.expire(now + ms(10)), 1);
    assert_eq!(q.next_expiry(), Some(now + ms(50)));
    assert_eq!(reports(&mut q), vec![MessageReport::Expired { id: 1 }]);
    assert_eq!(read_all(&mut q), b"latenever");
    // Committed messages do not expire from the queue.
    assert_eq!(q.expire(now + ms(100)), 0);
    q.check_invariants();
}

#[test]
fn dependencies_keep_messages_alive_transitively() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    q.insert_message(now, b"I", dep(1, None, Some(now + ms(10))), None)
        .unwrap();
    q.insert_message(now, b"P1", dep(2, Some(1), Some(now + ms(20))), None)
        .unwrap();
    q.insert_message(now, b"P2", dep(3, Some(2), Some(now + ms(40))), None)
        .unwrap();
    // At 15 ms message 1 is past its deadline but 2 (and 3, through 2) need it.
    assert_eq!(q.expire(now + ms(15)), 0);
    assert_eq!(q.expire(now + ms(30)), 0, "3 keeps 2 and, through it, 1");
    assert_eq!(q.expire(now + ms(40)), 3);
    let mut expired: Vec<u64> = reports(&mut q).iter().map(|r| r.id()).collect();
    expired.sort_unstable();
    assert_eq!(expired, vec![1, 2, 3]);
    assert!(q.is_empty());
    // A dependent without a deadline keeps its dependency forever; once it is squashed, the
    // dependency expires at its own deadline.
    let mut q = SendQueue::new(1000, false);
    q.insert_message(now, b"base", dep(1, None, Some(now + ms(10))), None)
        .unwrap();
    let forever = WriteTag {
        message_id: Some(2),
        depends_on: Some(1),
        squash_key: Some(9),
        ..Default::default()
    };
    q.insert_message(now, b"user", forever, None).unwrap();
    assert_eq!(q.expire(now + ms(20)), 0);
    assert_eq!(q.squash(now + ms(20), 9), 4);
    assert_eq!(q.expire(now + ms(20)), 1);
    assert!(q.is_empty());
}

#[test]
fn an_acknowledged_dependent_still_keeps_its_dependency() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    q.insert_message(now, b"base", msg(1, Some(now + ms(10))), None)
        .unwrap();
    // Squash-free, higher priority: the dependent goes first and is acknowledged.
    q.insert_message(
        now,
        b"dep",
        WriteTag {
            priority: 1,
            message_id: Some(2),
            depends_on: Some(1),
            deadline: Some(now + ms(100)),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let mut seg = [0u8; 3];
    q.copy_out(0, &mut seg);
    assert_eq!(&seg, b"dep");
    q.ack(3);
    assert_eq!(q.expire(now + ms(50)), 0, "the receiver needs 1 to use 2");
    assert_eq!(q.expire(now + ms(100)), 1);
}

#[test]
fn lifetimes_count_from_resolution() {
    let t0 = Instant::now();
    let mut q = SendQueue::new(1000, false);
    q.insert_message(t0, b"x", msg(1, None), Some(ms(10)))
        .unwrap();
    q.check_invariants();
    assert_eq!(q.next_expiry(), None, "no deadline before a clock reading");
    let t1 = t0 + ms(500);
    assert_eq!(q.expire(t1), 0);
    assert_eq!(q.next_expiry(), Some(t1 + ms(10)));
    assert_eq!(q.expire(t1 + ms(10)), 1);
    q.check_invariants();
}

#[test]
fn acknowledgment_reports_messages_with_deadlines() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    q.insert_message(now, b"aa", msg(1, Some(now + ms(10))), None)
        .unwrap();
    q.insert_message(now, b"bb", msg(2, None), None).unwrap();
    send_all(&mut q);
    q.ack(3);
    q.ack(4);
    assert_eq!(
        reports(&mut q),
        vec![
            MessageReport::Sent {
                id: 1,
                replacement: false
            },
            MessageReport::Sent {
                id: 2,
                replacement: false
            },
            MessageReport::Acked { id: 1 },
        ]
    );
}

/// Three committed 10-byte messages (ids 1-3, deadlines 10/20/30 ms) and pending live ones.
fn replacement_fixture(now: Instant) -> SendQueue {
    let mut q = SendQueue::new(10_000, false);
    for (id, d) in [(1, 10), (2, 20), (3, 30)] {
        let data = vec![b'0' + id as u8; 10];
        q.insert_message(now, &data, msg(id, Some(now + ms(d))), None)
            .unwrap();
    }
    send_all(&mut q);
    // Pending: 4 (6 bytes, 200 ms), 5 (4 bytes, 100 ms), 6 (3 bytes, no deadline),
    // 7 (12 bytes, 50 ms: too big for one message's range).
    q.insert_message(now, b"444444", msg(4, Some(now + ms(200))), None)
        .unwrap();
    q.insert_message(now, b"5555", msg(5, Some(now + ms(100))), None)
        .unwrap();
    q.insert_message(now, b"666", msg(6, None), None).unwrap();
    q.insert_message(now, b"777777777777", msg(7, Some(now + ms(50))), None)
        .unwrap();
    reports(&mut q);
    q
}

#[test]
fn replacement_takes_closest_to_expiry_live_messages_and_pads_exactly() {
    let now = Instant::now();
    let mut q = replacement_fixture(now);
    // Retransmitting message 1's range at 5 ms, arriving at 15 ms: 1 will have expired. The
    // live message closest to expiry is 2 (20 ms), in flight: a copy of it fills the range
    // exactly (Hollywood §4.2: every complete message in the send queue is a candidate).
    let r = q.replace_expired(0, 10, now + ms(5), now + ms(15), &Padder::from_fn(dots));
    assert_eq!(
        r,
        Replacement {
            ranges: 1,
            replaced: 1,
            replacements: 1
        }
    );
    let mut seg = [0u8; 10];
    q.copy_out(0, &mut seg);
    assert_eq!(&seg, b"2222222222");
    // The copy reports nothing (2 was reported sent at its first transmission).
    assert_eq!(reports(&mut q), vec![MessageReport::Replaced { id: 1 }]);
    assert_eq!(q.stats().replacement_copies, 1);
    assert_eq!(q.stats().replacement_messages, 0);
    // Nothing left the pending queue.
    assert_eq!(
        q.pending_writes().map(|(n, _)| n).collect::<Vec<_>>(),
        vec![6, 4, 3, 12]
    );
    q.check_invariants();
    // Messages 2 and 3 in one retransmission, arriving at 40 ms: one run of 20 bytes, and
    // every in-flight message has expired by then. 7 (50 ms) first, then 5 (100 ms); 4 does
    // not fit after them; 6 has no deadline: it must arrive, so it is never a replacement.
    let r = q.replace_expired(10, 30, now + ms(25), now + ms(40), &Padder::from_fn(dots));
    assert_eq!(r.replaced, 2);
    let mut seg = [0u8; 20];
    q.copy_out(10, &mut seg);
    assert_eq!(&seg, b"7777777777775555....");
    assert_eq!(q.stats().padding_bytes, 4);
    // 2 still has its copy in flight at [0, 10): only 3 is reported replaced.
    assert_eq!(
        reports(&mut q),
        vec![
            MessageReport::Sent {
                id: 7,
                replacement: true
            },
            MessageReport::Sent {
                id: 5,
                replacement: true
            },
            MessageReport::Replaced { id: 3 },
        ]
    );
    assert_eq!(
        q.pending_writes().map(|(n, _)| n).collect::<Vec<_>>(),
        vec![6, 3]
    );
    assert_eq!(q.len(), 30 + 9);
    q.check_invariants();
}

#[test]
fn a_message_carried_twice_reports_its_fate_once() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    q.insert_message(now, b"1111111111", msg(1, Some(now + ms(10))), None)
        .unwrap();
    q.insert_message(now, b"2222222222", msg(2, Some(now + ms(60))), None)
        .unwrap();
    send_all(&mut q);
    reports(&mut q);
    // 1's retransmission would be late: a copy of 2 goes in its range.
    let r = q.replace_expired(0, 10, now + ms(5), now + ms(15), &Padder::from_fn(dots));
    assert_eq!(r.replacements, 1);
    assert_eq!(reports(&mut q), vec![MessageReport::Replaced { id: 1 }]);
    // The copy is acknowledged: 2 has arrived, whatever becomes of its first transmission.
    q.ack(10);
    assert_eq!(reports(&mut q), vec![MessageReport::Acked { id: 2 }]);
    // A copy is made only of a message the queue carries once.
    q.insert_message(now, b"3333333333", msg(3, Some(now + ms(100))), None)
        .unwrap();
    // 2's first transmission is retransmitted late: 3 (pending) takes its place, and 2 is
    // not reported replaced — it was acknowledged.
    let r = q.replace_expired(10, 20, now + ms(50), now + ms(70), &Padder::from_fn(dots));
    assert_eq!(r.replaced, 1);
    let mut seg = [0u8; 10];
    q.copy_out(10, &mut seg);
    assert_eq!(&seg, b"3333333333");
    assert_eq!(
        reports(&mut q),
        vec![MessageReport::Sent {
            id: 3,
            replacement: true
        }]
    );
    q.ack(20);
    assert_eq!(reports(&mut q), vec![MessageReport::Acked { id: 3 }]);
    q.check_invariants();
}

#[test]
fn an_original_replaced_while_its_copy_flies_waits_for_the_copy() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    for (id, d) in [(1, 10), (2, 30), (3, 200)] {
        let data = vec![b'0' + id as u8; 10];
        q.insert_message(now, &data, msg(id, Some(now + ms(d))), None)
            .unwrap();
    }
    send_all(&mut q);
    reports(&mut q);
    // 1 late: a copy of 2 (closest to expiry) replaces it.
    q.replace_expired(0, 10, now + ms(5), now + ms(15), &Padder::from_fn(dots));
    assert_eq!(reports(&mut q), vec![MessageReport::Replaced { id: 1 }]);
    // 2's first transmission late too: the copy of 2 is still in flight, so 2 is not
    // reported replaced; 3 is copied in (live, in flight, carried once).
    let r = q.replace_expired(10, 20, now + ms(25), now + ms(40), &Padder::from_fn(dots));
    assert_eq!(r.replaced, 1);
    let mut seg = [0u8; 10];
    q.copy_out(10, &mut seg);
    assert_eq!(&seg, b"3333333333");
    assert_eq!(reports(&mut q), vec![]);
    // The copy of 2 is late as well, and nothing live fits but 3, which is carried twice
    // already: the range goes as padding (2 would only arrive late; issue 14), and 2, with no
    // copy left in flight, is reported replaced.
    let r = q.replace_expired(0, 10, now + ms(45), now + ms(60), &Padder::from_fn(dots));
    assert_eq!((r.replaced, r.replacements), (1, 0));
    let mut seg = [0u8; 10];
    q.copy_out(0, &mut seg);
    assert_eq!(&seg, b"..........");
    assert_eq!(reports(&mut q), vec![MessageReport::Replaced { id: 2 }]);
    // Everything acknowledged: 3 once for its two copies.
    q.ack(30);
    assert_eq!(reports(&mut q), vec![MessageReport::Acked { id: 3 }]);
    q.check_invariants();
}

#[test]
fn padding_from_an_earlier_replacement_can_be_replaced_again() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    q.insert_message(now, b"1111111111", msg(1, Some(now + ms(10))), None)
        .unwrap();
    send_all(&mut q);
    q.insert_message(now, b"AAAAAA", msg(2, Some(now + ms(50))), None)
        .unwrap();
    let r = q.replace_expired(0, 10, now + ms(20), now + ms(30), &Padder::from_fn(dots));
    assert_eq!(r.replacements, 1);
    let mut seg = [0u8; 10];
    q.copy_out(0, &mut seg);
    assert_eq!(&seg, b"AAAAAA....");
    // The replacement was lost too, and by now it has expired: it and the padding form one
    // run, filled anew.
    q.insert_message(now, b"BBBBBBBB", msg(3, Some(now + ms(500))), None)
        .unwrap();
    let r = q.replace_expired(0, 10, now + ms(100), now + ms(110), &Padder::from_fn(dots));
    assert_eq!(
        r,
        Replacement {
            ranges: 1,
            replaced: 1,
            replacements: 1
        }
    );
    q.copy_out(0, &mut seg);
    assert_eq!(&seg, b"BBBBBBBB..");
    assert_eq!(
        reports(&mut q),
        vec![
            MessageReport::Sent {
                id: 1,
                replacement: false
            },
            MessageReport::Sent {
                id: 2,
                replacement: true
            },
            MessageReport::Replaced { id: 1 },
            MessageReport::Sent {
                id: 3,
                replacement: true
            },
            MessageReport::Replaced { id: 2 },
        ]
    );
    q.check_invariants();
}

#[test]
fn no_replacement_while_the_original_would_still_be_useful() {
    let now = Instant::now();
    let mut q = replacement_fixture(now);
    // Arrival at 9 ms: message 1 (10 ms) still useful; retransmit as is.
    let r = q.replace_expired(0, 10, now + ms(1), now + ms(9), &Padder::from_fn(dots));
    assert_eq!(r, Replacement::default());
    let mut seg = [0u8; 10];
    q.copy_out(0, &mut seg);
    assert_eq!(seg, [b'1'; 10]);
    assert!(reports(&mut q).is_empty());
}

#[test]
fn no_replacement_of_messages_partly_received() {
    let now = Instant::now();
    let mut q = replacement_fixture(now);
    // The receiver SACKed bytes 12..14, inside message 2.
    q.mark_received(12, 14);
    let r = q.replace_expired(10, 20, now + ms(25), now + ms(40), &Padder::from_fn(dots));
    assert_eq!(r, Replacement::default());
    // Partly acknowledged: message 1 spans the cumulative ACK point.
    q.ack(5);
    let r = q.replace_expired(5, 10, now + ms(25), now + ms(40), &Padder::from_fn(dots));
    assert_eq!(r, Replacement::default());
    // Message 3 is untouched and replaceable.
    let r = q.replace_expired(20, 30, now + ms(25), now + ms(40), &Padder::from_fn(dots));
    assert_eq!(r.replaced, 1);
}

#[test]
fn never_replace_part_of_a_message() {
    let now = Instant::now();
    let mut q = replacement_fixture(now);
    // A retransmission of bytes 5..15 holds no whole message.
    let r = q.replace_expired(5, 15, now + ms(50), now + ms(60), &Padder::from_fn(dots));
    assert_eq!(r, Replacement::default());
    // 5..20 holds message 2 whole: only its range changes.
    let r = q.replace_expired(5, 20, now + ms(50), now + ms(60), &Padder::from_fn(dots));
    assert_eq!(r.replaced, 1);
    let mut seg = [0u8; 20];
    q.copy_out(0, &mut seg);
    assert_eq!(&seg[..10], &[b'1'; 10]);
    assert_eq!(&seg[10..], b"5555444444");
}

#[test]
fn no_replacement_when_a_live_message_depends_on_it() {
    let now = Instant::now();
    let mut q = replacement_fixture(now);
    q.insert_message(
        now,
        b"d",
        WriteTag {
            message_id: Some(9),
            depends_on: Some(1),
            deadline: Some(now + ms(500)),
            ..Default::default()
        },
        None,
    )
    .unwrap();
    let r = q.replace_expired(0, 10, now + ms(50), now + ms(60), &Padder::from_fn(dots));
    assert_eq!(r, Replacement::default());
}

#[test]
fn a_doomed_run_no_live_message_fits_goes_as_padding_unless_the_padder_fails() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    q.insert_message(now, b"abc", msg(1, Some(now + ms(10))), None)
        .unwrap();
    send_all(&mut q);
    reports(&mut q);
    q.insert_message(now, b"toolong", msg(2, Some(now + ms(100))), None)
        .unwrap();
    q.insert_message(now, b"x", msg(3, Some(now + ms(12))), None)
        .unwrap();
    q.insert_message(now, b"y", msg(4, None), None).unwrap();
    // A padder that writes the wrong length is refused: the original bytes stay.
    let r = q.replace_expired(
        0,
        3,
        now + ms(5),
        now + ms(15),
        &Padder::from_fn(wrong_length),
    );
    assert_eq!(r, Replacement::default());
    let mut seg = [0u8; 3];
    q.copy_out(0, &mut seg);
    assert_eq!(&seg, b"abc");
    // 3 fits but expires before arriving, 2 is live but too long, 4 must arrive (no
    // deadline): no live message fills the run. 1 would only arrive late, so the run goes as
    // padding alone (issue 14: resent unchanged, a burst's doomed messages arrived late).
    let r = q.replace_expired(0, 3, now + ms(5), now + ms(15), &Padder::from_fn(dots));
    assert_eq!(
        r,
        Replacement {
            ranges: 1,
            replaced: 1,
            replacements: 0
        }
    );
    q.copy_out(0, &mut seg);
    assert_eq!(&seg, b"...");
    assert_eq!(reports(&mut q), vec![MessageReport::Replaced { id: 1 }]);
    // Padding that no live message fills is resent as it is.
    let r = q.replace_expired(0, 3, now + ms(50), now + ms(60), &Padder::from_fn(dots));
    assert_eq!(r, Replacement::default());
    q.check_invariants();
    // Plain bytes are never replaced.
    let mut q = SendQueue::new(1000, false);
    q.push(b"bytes", WriteTag::default());
    send_all(&mut q);
    q.insert_message(now, b"y", msg(4, None), None).unwrap();
    let r = q.replace_expired(0, 5, now + ms(5), now + ms(15), &Padder::from_fn(dots));
    assert_eq!(r, Replacement::default());
}

#[test]
fn a_message_whose_dependency_was_dropped_expires_at_once() {
    let now = Instant::now();
    let mut q = SendQueue::new(1000, false);
    // Message 1 expires in the queue before anything depends on it.
    q.insert_message(now, b"I", dep(1, None, Some(now + ms(10))), None)
        .unwrap();
    assert_eq!(q.expire(now + ms(20)), 1);
    assert_eq!(drops(&mut q), vec![MessageReport::Expired { id: 1 }]);
    // 2 depends on it, 3 on 2: both are useless to the receiver (Hollywood §7.2), even 3,
    // which has no deadline, and neither squashes the pending message with its key.
    q.insert_message(
        now,
        b"keep",
        WriteTag {
            squash_key: Some(5),
            ..msg(9, None)
        },
        None,
    )
    .unwrap();
    q.insert_message(
        now + ms(20),
        b"P1",
        dep(2, Some(1), Some(now + ms(90))),
        None,
    )
    .unwrap();
    let forever = WriteTag {
        squash_key: Some(5),
        ..dep(3, Some(2), None)
    };
    q.insert_message(now + ms(20), b"P2", forever, None)
        .unwrap();
    assert_eq!(
        drops(&mut q),
        vec![
            MessageReport::Expired { id: 2 },
            MessageReport::Expired { id: 3 }
        ]
    );
    assert_eq!(q.stats().messages_expired, 3);
    assert_eq!(read_all(&mut q), b"keep");
    // A squashed message counts as dropped too.
    q.insert_message(
        now,
        b"old",
        WriteTag {
            squash_key: Some(7),
            ..msg(10, None)
        },
        None,
    )
    .unwrap();
    q.insert_message(
        now,
        b"new",
        WriteTag {
            squash_key: Some(7),
            ..msg(11, None)
        },
        None,
    )
    .unwrap();
    q.insert_message(now, b"on-old", dep(12, Some(10), None), None)
        .unwrap();
    q.insert_message(now, b"on-new", dep(13, Some(11), None), None)
        .unwrap();
    assert_eq!(
        drops(&mut q),
        vec![
            MessageReport::Squashed { id: 10 },
            MessageReport::Expired { id: 12 }
        ]
    );
    assert_eq!(read_all(&mut q), b"keepnewon-new");
    // A message that depends on one that was sent is queued as usual.
    send_all(&mut q);
    q.insert_message(now, b"on-sent", dep(14, Some(11), None), None)
        .unwrap();
    assert_eq!(read_all(&mut q), b"keepnewon-newon-sent");
    // An id used again is not a dropped one any more.
    q.insert_message(now, b"again", msg(1, None), None).unwrap();
    q.insert_message(now, b"on-again", dep(15, Some(1), None), None)
        .unwrap();
    assert_eq!(read_all(&mut q), b"keepnewon-newon-sentagainon-again");
    q.check_invariants();
}

#[test]
fn dropped_ids_are_remembered_within_a_bound() {
    let now = Instant::now();
    let mut q = SendQueue::new(1 << 20, false);
    let n = MAX_REMEMBERED_DROPS as u64 + 10;
    for id in 0..n {
        q.insert_message(now, b"x", msg(id, Some(now + ms(1))), None)
            .unwrap();
    }
    assert_eq!(q.expire(now + ms(2)), n as usize);
    assert!(q.dropped.len() <= MAX_REMEMBERED_DROPS);
    assert_eq!(q.dropped_ids.len(), q.dropped.len());
    // The oldest drops are forgotten: a message depending on one is sent (the standard
    // behaviour); a recent one still expires its dependents.
    q.insert_message(
        now,
        b"old",
        WriteTag {
            depends_on: Some(0),
            ..msg(n, None)
        },
        None,
    )
    .unwrap();
    q.insert_message(
        now,
        b"new",
        WriteTag {
            depends_on: Some(n - 1),
            ..msg(n + 1, None)
        },
        None,
    )
    .unwrap();
    assert_eq!(read_all(&mut q), b"old");
}

/// A padder with a shortest padding (as a TLS padding record has), remembering its calls.
struct MinPad {
    min: usize,
    calls: std::sync::Mutex<Vec<(std::ops::Range<u64>, usize)>>,
}

impl Pad for MinPad {
    fn min_len(&self) -> usize {
        self.min
    }

    fn pad(&self, range: std::ops::Range<u64>, len: usize, out: &mut Vec<u8>) -> bool {
        self.calls.lock().unwrap().push((range, len));
        dots(len, out);
        true
    }
}

#[test]
fn replacements_leave_no_padding_shorter_than_the_padder_writes() {
    let now = Instant::now();
    let mut q = replacement_fixture(now);
    let pad = std::sync::Arc::new(MinPad {
        min: 5,
        calls: Default::default(),
    });
    let padder = Padder::new(pad.clone());
    // As in the test above, 7 (12 bytes) goes first into the 20-byte run; 5 (4 bytes) would
    // leave 4 bytes, less than the padder's 5: skipped, the padding takes 8.
    let r = q.replace_expired(10, 30, now + ms(25), now + ms(40), &padder);
    assert_eq!(r.replacements, 1);
    let mut seg = [0u8; 20];
    q.copy_out(10, &mut seg);
    assert_eq!(&seg, b"777777777777........");
    // The padder saw the whole range and how much of it was its own.
    assert_eq!(*pad.calls.lock().unwrap(), vec![(10..30, 8)]);
    // A range shorter than the shortest padding that no candidate fills exactly is left as
    // it was (message 1's 10 bytes, with a 12-byte shortest padding).
    let mut q = replacement_fixture(now);
    let pad = std::sync::Arc::new(MinPad {
        min: 12,
        calls: Default::default(),
    });
    let r = q.replace_expired(0, 10, now + ms(5), now + ms(15), &Padder::new(pad.clone()));
    assert_eq!(r.ranges, 1, "a copy of 2 fills the 10 bytes exactly");
    assert_eq!(*pad.calls.lock().unwrap(), vec![(0..10, 0)]);
    q.check_invariants();
}

#[test]
fn a_declining_padder_keeps_the_original_bytes() {
    struct Decline;
    impl Pad for Decline {
        fn pad(&self, _: std::ops::Range<u64>, _: usize, _: &mut Vec<u8>) -> bool {
            false
        }
    }
    let now = Instant::now();
    let mut q = replacement_fixture(now);
    let r = q.replace_expired(
        10,
        30,
        now + ms(25),
        now + ms(40),
        &Padder::new(std::sync::Arc::new(Decline)),
    );
    assert_eq!(r, Replacement::default());
    assert!(reports(&mut q).is_empty());
    q.check_invariants();
}

#[test]
fn without_evidence_of_loss_only_copies_fill_a_run() {
    // A timeout's go-back-N or a tail loss probe resends ranges nothing shows lost: if the
    // receiver has the originals it drops the retransmission, and a pending message moved
    // into it would never arrive (issue 14). Only copies of messages in flight, or padding.
    let now = Instant::now();
    let mut q = replacement_fixture(now);
    let r = q.replace_expired_with(
        10,
        30,
        now + ms(25),
        now + ms(40),
        &Padder::from_fn(dots),
        false,
    );
    // Messages 2 and 3 doomed; the in-flight ones have expired by then too, and the pending
    // 7 and 5 stay pending: padding alone.
    assert_eq!((r.ranges, r.replaced, r.replacements), (1, 2, 0));
    let mut seg = [0u8; 20];
    q.copy_out(10, &mut seg);
    assert_eq!(&seg, b"....................");
    assert_eq!(
        q.pending_writes().map(|(n, _)| n).collect::<Vec<_>>(),
        vec![6, 4, 3, 12]
    );
    // With evidence (the default), 7 and 5 move in.
    let mut q = replacement_fixture(now);
    let r = q.replace_expired(10, 30, now + ms(25), now + ms(40), &Padder::from_fn(dots));
    assert_eq!(r.replacements, 2);
    q.check_invariants();
}
