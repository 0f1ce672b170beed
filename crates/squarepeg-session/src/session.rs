//! The session state machine.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use squarepeg_framing::{Frame, FrameError, FrameFormat, FrameHeader, MessageRun};

use crate::config::{
    Config, ConfigError, DEFAULT_INITIAL_MAX_DATA, DEFAULT_INITIAL_MAX_STREAM_DATA,
    DEFAULT_INITIAL_MAX_STREAMS, MAX_MESSAGE_SIZE,
};
use crate::control::{self, ControlFrame, Params};
use crate::error::{ConnectionError, ProtocolError, SendError, StreamError, TransportError};
use crate::hash::{IntMap, IntSet};
use crate::scheduler::{Flow, Scheduler};
use crate::stream::{ReadOutcome, RecvHalf, SendHalf, initiated_by_client};
use crate::table::MessageTable;
use crate::window::NumberWindow;
use crate::{MessageNumber, PathPolicy, Priority, StreamId};

/// Which end of the connection this session is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Opened the connection; opens even-numbered streams.
    Client,
    /// Accepted the connection; opens odd-numbered streams.
    Server,
}

/// Per-message sending properties (Hollywood §7.2).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MessageProps {
    /// Sub-stream id, carried on the wire (0 is the default sub-stream).
    pub substream: u64,
    /// Urgency class.
    pub priority: Priority,
    /// How long after queueing the message is still worth sending.
    pub lifetime: Option<Duration>,
    /// A message this one depends on: it is kept while this one is needed,
    /// and this one is dropped if it was dropped.
    pub depends_on: Option<MessageNumber>,
    /// A newer message with the same key replaces this one while it is
    /// still queued.
    pub squash_key: Option<u64>,
    /// The application can take this message more than once (TAPS
    /// `safelyReplayable`, RFC 9622 §9.1.3.4): only such messages may go as TLS 1.3 early
    /// data (0-RTT), which an attacker can replay. Messages without it wait for the end of
    /// the handshake.
    pub safely_replayable: bool,
    /// Which connection carries it when the session spans several; `None`: the session's
    /// default ([`Config::message_path`]).
    pub path: Option<PathPolicy>,
}

/// A received message. The payload is a slice of the buffer it was
/// decoded into (no copy per message); `Vec::from(payload)` or
/// `payload.to_vec()` gives an owned vector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub substream: u64,
    pub number: MessageNumber,
    pub payload: Bytes,
}

/// What became of a sent message (Transport Services' Sent/Expired).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageStatus {
    /// Handed to the transport; over a reliable substrate it will arrive
    /// unless the connection fails.
    Sent,
    /// Dropped before it reached the transport: its lifetime ended, or the
    /// message it depends on was dropped.
    Expired,
    /// Replaced by a newer message with the same squash key.
    Squashed,
    /// Dropped because the connection closed or aborted first.
    Discarded,
    /// Transmitted once, then its retransmission carried other, live messages instead
    /// (an inconsistent retransmission, Hollywood §4.2, over the userspace TCP only): it
    /// arrives if its first transmission did, and not otherwise.
    Replaced,
}

/// Something the application may want to react to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// Final status of messages `numbers` (consecutive numbers that got the same status in
    /// a row: a batch of messages sent together is one event, not one per message).
    MessageStatus {
        numbers: std::ops::Range<MessageNumber>,
        status: MessageStatus,
    },
    /// The receive queue went from empty to non-empty.
    MessagesReceived,
    /// The peer opened streams; see [`Session::accept_stream`].
    StreamIncoming,
    /// The peer raised its stream limit; [`Session::open_stream`] may work.
    StreamsAvailable,
    /// A read that found nothing can now return data, the end, or an error.
    StreamReadable(StreamId),
    /// A short write can now make progress, or will fail.
    StreamWritable(StreamId),
    /// Room was freed in the message send queue after `QueueFull`.
    SendQueueAvailable,
    /// The connection is closed; every call now returns this error.
    ConnectionLost(ConnectionError),
}

impl Event {
    /// Appends message `number`'s `status` to `events`: to the run at the back if it
    /// continues it (the same status, the next number), else as a run of its own. Runs: a
    /// bulk sender's statuses cost one event per batch, not one per message.
    pub fn push_status(events: &mut VecDeque<Event>, number: MessageNumber, status: MessageStatus) {
        if let Some(Event::MessageStatus {
            numbers,
            status: last,
        }) = events.back_mut()
            && *last == status
            && numbers.end == number
        {
            numbers.end += 1;
            return;
        }
        events.push_back(Event::MessageStatus {
            numbers: number..number + 1,
            status,
        });
    }
}

/// Received messages, as [`Session::poll_received`] hands them out.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Received {
    /// A message on its own.
    One(Message),
    /// Consecutive messages still in the frames they came in (never empty): take them out
    /// in order with [`MessageRun::pop_front`].
    Run(MessageRun),
}

impl Received {
    /// Messages in it.
    pub fn len(&self) -> usize {
        match self {
            Received::One(_) => 1,
            Received::Run(run) => run.len(),
        }
    }

    /// Whether it holds no message (a run whose messages were all taken).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Payload bytes of its messages.
    pub fn payload_len(&self) -> usize {
        match self {
            Received::One(m) => m.payload.len(),
            Received::Run(run) => run.payload_len(),
        }
    }

    /// Takes the oldest message out of `queue` (a run's first, the run dropped once empty).
    #[inline]
    pub fn pop_message(queue: &mut VecDeque<Received>) -> Option<Message> {
        match queue.front_mut()? {
            Received::Run(run) => {
                let (substream, number, payload) = run.pop_front()?;
                if run.is_empty() {
                    queue.pop_front();
                }
                Some(Message {
                    substream,
                    number,
                    payload,
                })
            }
            Received::One(_) => match queue.pop_front()? {
                Received::One(m) => Some(m),
                Received::Run(_) => None,
            },
        }
    }

    /// What its messages count against the receive queue (`message_queue_cost` of each).
    fn queue_cost(&self) -> usize {
        self.payload_len() + MESSAGE_RECORD_BYTES * self.len()
    }
}

/// A frame [`Session::poll_transmit`] appended, with the metadata a tagged
/// send queue needs to keep binding late (Minion §4.2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Encoded bytes appended to the buffer.
    pub len: usize,
    /// The frame's class; `None` for control frames, which go first.
    pub priority: Option<Priority>,
    pub content: TransmitContent,
    /// Which connection should carry it when the session spans several (control frames:
    /// the lowest-RTT one).
    pub path: PathPolicy,
}

/// What [`Session::poll_transmit_fitted`] appended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FittedBatch {
    /// Frames appended.
    pub frames: usize,
    /// It stopped at a frame longer than the room left (not at an empty queue): there is
    /// more to send now.
    pub next_does_not_fit: bool,
}

/// The room of a [`Session::poll_transmit_fitted`] call, for the frame being made.
#[derive(Clone, Copy, Debug)]
struct Fit {
    room: usize,
    /// A message longer than `room` is not taken.
    must_fit: bool,
    /// The scheduler's next frame did not fit: it waits, its flow still active.
    blocked: bool,
}

/// What a transmitted frame carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TransmitContent {
    Control,
    Message {
        number: MessageNumber,
        substream: u64,
        deadline: Option<Instant>,
        depends_on: Option<MessageNumber>,
        squash_key: Option<u64>,
    },
    StreamChunk {
        stream: StreamId,
        offset: u64,
        len: usize,
        fin: bool,
    },
}

/// Counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// RECORDS_REPLACED announcements not kept for the record layer (more than
    /// [`MAX_RECORDS_REPLACED`] waiting).
    pub records_replaced_dropped: u64,
    pub messages_sent: u64,
    pub messages_expired: u64,
    pub messages_squashed: u64,
    pub messages_discarded: u64,
    pub messages_received: u64,
    /// Messages dropped as duplicates (or older than the dedup window).
    pub duplicate_messages: u64,
    pub stream_bytes_sent: u64,
    pub stream_bytes_received: u64,
    pub frames_sent: u64,
    pub frames_received: u64,
    /// The format this side's frames are written in now (docs/wire.md §3).
    pub send_format: FrameFormat,
    /// The format the peer's frames are read in now.
    pub receive_format: FrameFormat,
}

/// PARAMS receive_formats with uCOBS (bit 0) and plain frames (bit 1).
const FORMATS_WITH_PLAIN: u64 = 0b11;

/// RECORDS_REPLACED announcements kept until the record layer takes them, at most.
pub const MAX_RECORDS_REPLACED: usize = 4096;

/// What a message costs the message queues beyond its payload: about the memory of the
/// record each queue keeps for it (number, properties, payload handle, flow entry). Counted
/// so that `Config::message_send_queue` and `message_receive_queue` bound the memory the
/// queues take, not only their payloads: a full 8 MiB queue of 64-byte messages used to
/// hold 131 072 records, three times the payload, and sweeping them through the caches cost
/// a sending process a quarter of its CPU (docs/results.md, "Messages over kernel TCP").
pub const MESSAGE_RECORD_BYTES: usize = 128;

/// What a message of `payload_len` bytes counts against the message queues' limits.
pub fn message_queue_cost(payload_len: usize) -> usize {
    payload_len.saturating_add(MESSAGE_RECORD_BYTES)
}

/// The frame-format choices of a session (docs/wire.md §3).
#[derive(Clone, Copy, Debug, Default)]
struct Formats {
    /// Announce (and accept a Switch to) plain frames.
    receive_plain: bool,
    /// Switch the sending direction to plain frames if the peer reads them.
    send_plain: bool,
    /// The peer announced plain frames: the Switch goes out next.
    switch_pending: bool,
}

#[derive(Debug)]
struct QueuedMessage {
    substream: u64,
    priority: Priority,
    payload: Bytes,
    deadline: Option<Instant>,
    depends_on: Option<MessageNumber>,
    squash_key: Option<u64>,
    /// May go as early data (see [`MessageProps::safely_replayable`]).
    replayable: bool,
    path: PathPolicy,
    /// Queued messages that depend on this one.
    dependents: u32,
    /// A message that depends on this one was sent: never drop it.
    pinned: bool,
    /// The deadline passed but dependents keep it.
    expired: bool,
}

/// A message leaving the queue as sent: what its frame and its [`Transmit`] need.
struct SentMessage {
    payload: Bytes,
    path: PathPolicy,
    deadline: Option<Instant>,
    depends_on: Option<MessageNumber>,
    squash_key: Option<u64>,
}

impl QueuedMessage {
    fn droppable(&self) -> bool {
        self.dependents == 0 && !self.pinned
    }
}

/// A queued message's place in its flow.
#[derive(Debug)]
enum FlowEntry {
    /// A message nothing looks up by number (no lifetime, squash key or dependency: it can
    /// leave only from its flow's front, or at close): kept here rather than in the table,
    /// which saves a table insert and removal per message — most messages of a bulk sender.
    Inline(InlineMessage),
    /// A message in the session's table (gone from it once squashed or expired).
    Tabled(MessageNumber),
}

#[derive(Debug)]
struct InlineMessage {
    number: MessageNumber,
    payload: Bytes,
    path: PathPolicy,
    replayable: bool,
}

impl FlowEntry {
    fn inline(
        number: MessageNumber,
        payload: Bytes,
        path: PathPolicy,
        props: &MessageProps,
    ) -> Self {
        FlowEntry::Inline(InlineMessage {
            number,
            payload,
            path,
            replayable: props.safely_replayable,
        })
    }

    fn number(&self) -> MessageNumber {
        match self {
            FlowEntry::Inline(m) => m.number,
            FlowEntry::Tabled(n) => *n,
        }
    }
}

/// The queue of flow `key`, made (with the spare queue's memory) if it has none.
fn flow_queue<'a>(
    flows: &'a mut IntMap<(Priority, u64), FlowQueue>,
    spare: &mut VecDeque<FlowEntry>,
    key: (Priority, u64),
) -> &'a mut FlowQueue {
    flows.entry(key).or_insert_with(|| FlowQueue {
        entries: std::mem::take(spare),
        live: 0,
    })
}

/// The queued messages of one flow, oldest first.
#[derive(Debug, Default)]
struct FlowQueue {
    entries: VecDeque<FlowEntry>,
    /// How many of `entries` are still queued.
    live: usize,
}

impl FlowQueue {
    fn push(&mut self, entry: FlowEntry) {
        self.entries.push_back(entry);
        self.live += 1;
    }

    /// Forgets tabled message `n` (already gone from the table, like every number `alive`
    /// rejects). Its entry is skipped when it reaches the front; the queue is compacted when
    /// dead entries outnumber live ones, so squashing while the transport is blocked cannot
    /// grow it without bound.
    fn remove(&mut self, n: MessageNumber, alive: impl Fn(MessageNumber) -> bool) {
        self.live = self.live.saturating_sub(1);
        if matches!(self.entries.front(), Some(FlowEntry::Tabled(k)) if *k == n) {
            self.entries.pop_front();
        } else if self.entries.len() > 2 * self.live + 64 {
            self.entries.retain(|e| match e {
                FlowEntry::Inline(_) => true,
                FlowEntry::Tabled(k) => alive(*k),
            });
        }
    }

    /// The oldest entry still queued.
    fn front(&mut self, alive: impl Fn(MessageNumber) -> bool) -> Option<&FlowEntry> {
        while let Some(FlowEntry::Tabled(n)) = self.entries.front() {
            if alive(*n) {
                break;
            }
            self.entries.pop_front();
        }
        self.entries.front()
    }

    /// Takes the front entry (which [`FlowQueue::front`] found queued) as it is sent.
    fn pop_front(&mut self) -> Option<FlowEntry> {
        let e = self.entries.pop_front()?;
        self.live = self.live.saturating_sub(1);
        Some(e)
    }
}

#[derive(Debug)]
struct StreamState {
    send: SendHalf,
    recv: RecvHalf,
    /// Connection credit released up to this offset of the receive half.
    released_to: u64,
    /// The application let go of the stream.
    released: bool,
    write_blocked: bool,
    read_blocked: bool,
    /// Queued in `incoming` and not yet accepted.
    unaccepted: bool,
}

#[derive(Debug)]
enum State {
    Open,
    /// Graceful close requested: flush, then send APPLICATION_CLOSE.
    Closing {
        code: u64,
        reason: Vec<u8>,
    },
    Closed {
        error: ConnectionError,
        /// The CLOSE frame still to send.
        close_frame: Option<ControlFrame>,
        /// The peer is done (its CLOSE or the transport's end arrived, or
        /// the drain timer fired).
        peer_done: bool,
        drain_deadline: Option<Instant>,
    },
}

/// One connection's session: see the crate documentation.
#[derive(Debug)]
pub struct Session {
    role: Role,
    config: Config,
    state: State,
    events: VecDeque<Event>,
    stats: Stats,

    /// Frame formats (docs/wire.md §3): what this side announces it reads,
    /// whether its sending side may switch, and a switch decided but not
    /// yet sent.
    formats: Formats,
    /// PARAMS record_numbers this side announces (docs/wire.md §5).
    record_numbers: Option<u64>,
    /// The peer's PARAMS record_numbers.
    peer_record_numbers: Option<u64>,
    /// Ranges the peer announced replaced, for the record layer to take.
    records_replaced: VecDeque<std::ops::Range<u64>>,

    // Control frames waiting to go, coalesced: flags and sets, not a queue
    // of frames, so repeated credit updates cost one frame.
    params_pending: bool,
    /// A frame from the peer arrived, in any state (one that comes while this side drains
    /// counts too): the peer runs a squarepeg session.
    peer_frame_seen: bool,
    max_data_pending: bool,
    max_streams_pending: bool,
    max_stream_data_pending: BTreeSet<StreamId>,
    control_queue: VecDeque<ControlFrame>,
    control_body: Vec<u8>,

    // Messages, send side.
    next_message: MessageNumber,
    messages: MessageTable<QueuedMessage>,
    /// Queued message numbers per (class, sub-stream), in number order.
    /// Entries of messages removed out of turn (squash, expiry) stay until
    /// they reach the front or the queue is compacted.
    message_flows: IntMap<(Priority, u64), FlowQueue>,
    /// An empty flow queue's memory, for the next flow (see [`Session::keep_spare`]).
    spare_flow_entries: VecDeque<FlowEntry>,
    deadlines: BTreeSet<(Instant, MessageNumber)>,
    squash: IntMap<u64, MessageNumber>,
    /// Recently dropped (expired, squashed) numbers, for `depends_on`.
    dropped: NumberWindow,
    queued_message_bytes: usize,
    queue_full_reported: bool,

    // Messages, receive side.
    /// Received messages, oldest first: single ones and runs as read (see
    /// [`Session::handle_message_run`]); never an empty run.
    received: VecDeque<Received>,
    received_bytes: usize,
    seen: NumberWindow,

    // Streams.
    streams: IntMap<StreamId, StreamState>,
    incoming: VecDeque<StreamId>,
    /// Streams this side opened so far.
    local_opened: u64,
    /// Streams the peer lets us open in total.
    peer_max_streams: u64,
    /// Streams the peer opened so far.
    peer_opened: u64,
    /// Streams we let the peer open in total.
    local_max_streams: u64,
    peer_initial_max_stream_data: u64,
    /// Streams with data waiting for connection credit.
    conn_blocked: IntSet<StreamId>,

    // Connection flow control.
    conn_send_max: u64,
    conn_sent: u64,
    conn_recv_max: u64,
    conn_recv_highest: u64,
    conn_consumed: u64,

    scheduler: Scheduler,
    /// During [`Session::poll_transmit_fitted`]: the room left for frames.
    fit: Option<Fit>,
}

impl Session {
    /// A session for a connection that is already established.
    pub fn new(role: Role, config: Config) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Self {
            role,
            state: State::Open,
            events: VecDeque::new(),
            stats: Stats::default(),
            formats: Formats::default(),
            record_numbers: None,
            peer_record_numbers: None,
            records_replaced: VecDeque::new(),
            params_pending: true,
            peer_frame_seen: false,
            max_data_pending: false,
            max_streams_pending: false,
            max_stream_data_pending: BTreeSet::new(),
            control_queue: VecDeque::new(),
            control_body: Vec::with_capacity(64),
            next_message: 0,
            messages: MessageTable::default(),
            message_flows: IntMap::default(),
            spare_flow_entries: VecDeque::new(),
            deadlines: BTreeSet::new(),
            squash: IntMap::default(),
            dropped: NumberWindow::new(config.dedup_window),
            queued_message_bytes: 0,
            queue_full_reported: false,
            received: VecDeque::new(),
            received_bytes: 0,
            seen: NumberWindow::new(config.dedup_window),
            streams: IntMap::default(),
            incoming: VecDeque::new(),
            local_opened: 0,
            peer_max_streams: DEFAULT_INITIAL_MAX_STREAMS,
            peer_opened: 0,
            local_max_streams: config.max_concurrent_peer_streams,
            peer_initial_max_stream_data: DEFAULT_INITIAL_MAX_STREAM_DATA,
            conn_blocked: IntSet::default(),
            conn_send_max: DEFAULT_INITIAL_MAX_DATA,
            conn_sent: 0,
            conn_recv_max: config.connection_receive_window,
            conn_recv_highest: 0,
            conn_consumed: 0,
            scheduler: Scheduler::new(config.chunk_size),
            fit: None,
            config,
        })
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn stats(&self) -> Stats {
        self.stats
    }

    /// The error that closed the connection, if it is closed.
    pub fn error(&self) -> Option<&ConnectionError> {
        match &self.state {
            State::Closed { error, .. } => Some(error),
            _ => None,
        }
    }

    /// Whether a graceful close is flushing.
    pub fn is_closing(&self) -> bool {
        matches!(self.state, State::Closing { .. })
    }

    /// Whether the session is finished: closed, its CLOSE frame (if any)
    /// handed out, and the peer done or the drain timer expired. The driver
    /// then flushes what it holds, closes the transport and stops.
    pub fn is_drained(&self) -> bool {
        matches!(
            self.state,
            State::Closed {
                close_frame: None,
                peer_done: true,
                ..
            }
        )
    }

    /// Whether the session has nothing more to send, ever: the driver may
    /// shut down the transport's sending side once its buffer is flushed.
    pub fn is_send_finished(&self) -> bool {
        matches!(
            self.state,
            State::Closed {
                close_frame: None,
                ..
            }
        )
    }

    /// Whether [`Session::poll_event`] has something: cheaper than asking
    /// it for a caller that prepares to dispatch events.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The next event for the application.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn check_open(&self) -> Result<(), ConnectionError> {
        match &self.state {
            State::Closed { error, .. } => Err(error.clone()),
            _ => Ok(()),
        }
    }

    // ---------------------------------------------------------------------
    // Messages.

    /// Whether any message waits to be handed to the transport. A driver
    /// that drains the queue whenever it is non-empty need only be woken
    /// when a message arrives in an empty queue.
    pub fn has_queued_messages(&self) -> bool {
        // Every queued message is in one flow, and a flow leaves the map once empty.
        !self.message_flows.is_empty()
    }

    /// Bytes of messages queued and not yet handed to the transport.
    pub fn queued_message_bytes(&self) -> usize {
        self.queued_message_bytes
    }

    /// Whether a message of `len` bytes fits the send queue now. If not,
    /// [`Event::SendQueueAvailable`] follows once room is freed.
    pub fn message_queue_has_room(&mut self, len: usize) -> bool {
        let room = self.queued_message_bytes == 0
            || self.queued_message_bytes + message_queue_cost(len)
                <= self.config.message_send_queue;
        if !room {
            self.queue_full_reported = true;
        }
        room
    }

    /// Queues a message; returns its number. Fails with `QueueFull` when the
    /// queue holds `Config::message_send_queue` bytes (the driver may wait
    /// for `Event::SendQueueAvailable` and retry). `now` only sets the
    /// deadline of a message with a lifetime; for one without, any instant
    /// will do (a driver queueing many messages need not read the clock
    /// for each).
    pub fn send_message(
        &mut self,
        now: Instant,
        payload: impl Into<Bytes>,
        props: MessageProps,
    ) -> Result<MessageNumber, SendError> {
        self.queue_message(now, payload.into(), props, true)
    }

    /// [`Session::send_message`] for a message the caller admitted against the send queue's
    /// limit already (a driver that takes messages queued by the application into a staging
    /// queue of its own, which counted them against the same limit): no `QueueFull`, so the
    /// numbers the caller handed out stay the session's. The other checks stay.
    pub fn send_admitted_message(
        &mut self,
        now: Instant,
        payload: impl Into<Bytes>,
        props: MessageProps,
    ) -> Result<MessageNumber, SendError> {
        self.queue_message(now, payload.into(), props, false)
    }

    /// [`Session::send_admitted_message`] for each of `messages` (each with the `now` it was
    /// queued at), in order, as many calls would; stops at the first the session refuses and
    /// returns how many it took and why it stopped (what is left in the iterator is not
    /// taken). Faster per message: a run of messages of one flow without lifetime, squash
    /// key or dependency joins the flow's queue with the flow looked up once.
    pub fn send_admitted_messages(
        &mut self,
        messages: impl IntoIterator<Item = (Instant, Bytes, MessageProps)>,
    ) -> (usize, Option<SendError>) {
        let inline = |payload: &Bytes, props: &MessageProps| {
            payload.len() <= MAX_MESSAGE_SIZE
                && props.lifetime.is_none()
                && props.depends_on.is_none()
                && props.squash_key.is_none()
        };
        let mut messages = messages.into_iter();
        let mut taken = 0;
        // The next message, taken from `messages` by the run before it (not `Peekable`: its
        // `next_if` moved each 130-byte item through two more `Option`s, ~90 instructions a
        // message).
        let mut following = messages.next();
        while let Some((now, payload, props)) = following.take() {
            if !(matches!(self.state, State::Open) && inline(&payload, &props)) {
                match self.queue_message(now, payload, props, false) {
                    Ok(_) => taken += 1,
                    Err(e) => return (taken, Some(e)),
                }
                following = messages.next();
                continue;
            }
            // What `queue_message` does for such a message, for the whole run.
            let key = (props.priority, props.substream);
            let flow = flow_queue(&mut self.message_flows, &mut self.spare_flow_entries, key);
            let was_idle = flow.live == 0;
            let (mut payload, mut props) = (payload, props);
            loop {
                let number = self.next_message;
                self.next_message += 1;
                self.queued_message_bytes += message_queue_cost(payload.len());
                let path = props.path.unwrap_or(self.config.message_path);
                flow.push(FlowEntry::inline(number, payload, path, &props));
                taken += 1;
                match messages.next() {
                    Some((_, p, pr)) if (pr.priority, pr.substream) == key && inline(&p, &pr) => {
                        (payload, props) = (p, pr);
                    }
                    other => {
                        following = other;
                        break;
                    }
                }
            }
            if was_idle {
                self.scheduler
                    .activate(key.0, Flow::Messages { substream: key.1 });
            }
        }
        (taken, None)
    }

    fn queue_message(
        &mut self,
        now: Instant,
        payload: Bytes,
        props: MessageProps,
        check_room: bool,
    ) -> Result<MessageNumber, SendError> {
        match &self.state {
            State::Open => {}
            State::Closing { .. } => return Err(SendError::Closing),
            State::Closed { error, .. } => return Err(error.clone().into()),
        }
        if payload.len() > MAX_MESSAGE_SIZE {
            return Err(SendError::TooLarge {
                len: payload.len(),
                max: MAX_MESSAGE_SIZE,
            });
        }
        if check_room && !self.message_queue_has_room(payload.len()) {
            return Err(SendError::QueueFull {
                queued: self.queued_message_bytes,
                limit: self.config.message_send_queue,
            });
        }
        if let Some(d) = props.depends_on
            && d >= self.next_message
        {
            return Err(SendError::UnknownDependency {
                depends_on: d,
                next: self.next_message,
            });
        }
        let number = self.next_message;
        self.next_message += 1;
        // Hollywood §7.2: a message whose dependency expired has expired.
        if let Some(d) = props.depends_on
            && !self.messages.contains(d)
            && self.dropped.contains(d) == Some(true)
        {
            self.dropped.insert(number);
            self.report(number, MessageStatus::Expired);
            return Ok(number);
        }
        if let Some(key) = props.squash_key
            && let Some(old) = self.squash.insert(key, number)
            && self.messages.get(old).is_some_and(|m| m.droppable())
        {
            self.remove_message(old, MessageStatus::Squashed);
        }
        if let Some(d) = props.depends_on
            && let Some(dep) = self.messages.get_mut(d)
        {
            dep.dependents += 1;
        }
        let deadline = props.lifetime.map(|l| now + l);
        if let Some(t) = deadline {
            self.deadlines.insert((t, number));
        }
        self.queued_message_bytes += message_queue_cost(payload.len());
        let path = props.path.unwrap_or(self.config.message_path);
        let inline = deadline.is_none() && props.depends_on.is_none() && props.squash_key.is_none();
        let flow = flow_queue(
            &mut self.message_flows,
            &mut self.spare_flow_entries,
            (props.priority, props.substream),
        );
        // The payload, if the message goes into the table.
        let tabled = if inline {
            flow.push(FlowEntry::inline(number, payload, path, &props));
            None
        } else {
            flow.push(FlowEntry::Tabled(number));
            Some(payload)
        };
        // A flow with queued messages is in the scheduler already (it
        // leaves only once empty): only a flow that just became non-empty
        // needs activating.
        if flow.live == 1 {
            self.scheduler.activate(
                props.priority,
                Flow::Messages {
                    substream: props.substream,
                },
            );
        }
        let Some(payload) = tabled else {
            return Ok(number);
        };
        self.messages.insert(
            number,
            QueuedMessage {
                substream: props.substream,
                priority: props.priority,
                payload,
                deadline,
                depends_on: props.depends_on,
                squash_key: props.squash_key,
                replayable: props.safely_replayable,
                path,
                dependents: 0,
                pinned: false,
                expired: false,
            },
        );
        Ok(number)
    }

    fn report(&mut self, number: MessageNumber, status: MessageStatus) {
        match status {
            MessageStatus::Sent => self.stats.messages_sent += 1,
            MessageStatus::Expired | MessageStatus::Replaced => self.stats.messages_expired += 1,
            MessageStatus::Squashed => self.stats.messages_squashed += 1,
            MessageStatus::Discarded => self.stats.messages_discarded += 1,
        }
        Event::push_status(&mut self.events, number, status);
    }

    /// Takes message `number` out of the queue with `status`, then applies
    /// the dependency rules down the chain of messages it depends on.
    /// Returns the removed message.
    fn remove_message(
        &mut self,
        number: MessageNumber,
        status: MessageStatus,
    ) -> Option<QueuedMessage> {
        let first = self.take_message(number, status)?;
        let mut dep = first.depends_on;
        if status == MessageStatus::Sent {
            self.pin_dependencies(dep);
        } else {
            // A dropped message releases its dependency, which may itself
            // be expired and now unneeded, and so on down the chain.
            while let Some(d) = dep {
                let Some(m) = self.messages.get_mut(d) else {
                    break;
                };
                m.dependents = m.dependents.saturating_sub(1);
                if !(m.expired && m.droppable()) {
                    break;
                }
                dep = self
                    .take_message(d, MessageStatus::Expired)
                    .and_then(|m| m.depends_on);
            }
        }
        Some(first)
    }

    /// A message that depends on `dep` was sent: the receiver will need
    /// everything it builds on, so the chain down from `dep` is kept.
    fn pin_dependencies(&mut self, mut dep: Option<MessageNumber>) {
        let mut decrement = true;
        while let Some(d) = dep {
            let Some(m) = self.messages.get_mut(d) else {
                break;
            };
            if std::mem::take(&mut decrement) {
                m.dependents = m.dependents.saturating_sub(1);
            }
            if m.pinned {
                break;
            }
            m.pinned = true;
            dep = m.depends_on;
        }
    }

    fn take_message(
        &mut self,
        number: MessageNumber,
        status: MessageStatus,
    ) -> Option<QueuedMessage> {
        let msg = self.messages.remove(number)?;
        let key = (msg.priority, msg.substream);
        let messages = &self.messages;
        if let Some(q) = self.message_flows.get_mut(&key) {
            q.remove(number, |k| messages.contains(k));
            if q.live == 0 {
                self.retire_flow(key);
            }
        }
        self.forget_message(number, &msg, status);
        Some(msg)
    }

    /// The rest of taking message `number` out of the queue, once it has
    /// left the table and its flow: its deadline, squash key, queued bytes
    /// and status.
    fn forget_message(
        &mut self,
        number: MessageNumber,
        msg: &QueuedMessage,
        status: MessageStatus,
    ) {
        if let Some(t) = msg.deadline {
            self.deadlines.remove(&(t, number));
        }
        if let Some(k) = msg.squash_key
            && self.squash.get(&k) == Some(&number)
        {
            self.squash.remove(&k);
        }
        self.dequeued(number, msg.payload.len(), status);
    }

    /// The queue's side of a message of `len` payload bytes leaving it with `status`: its
    /// bytes, the queue's room, its status.
    fn dequeued(&mut self, number: MessageNumber, len: usize, status: MessageStatus) {
        self.queued_message_bytes -= message_queue_cost(len);
        if self.queue_full_reported
            && self.queued_message_bytes <= self.config.message_send_queue / 2
        {
            self.queue_full_reported = false;
            self.events.push_back(Event::SendQueueAvailable);
        }
        if status != MessageStatus::Sent {
            self.dropped.insert(number);
        }
        self.report(number, status);
    }

    /// Drops messages whose deadline passed and that nothing keeps.
    fn expire(&mut self, now: Instant) {
        while let Some(&(t, n)) = self.deadlines.first() {
            if t > now {
                break;
            }
            self.deadlines.pop_first();
            let droppable = match self.messages.get_mut(n) {
                Some(m) => {
                    m.expired = true;
                    m.droppable()
                }
                None => continue,
            };
            if droppable {
                self.remove_message(n, MessageStatus::Expired);
            }
        }
    }

    /// Whether credit updates or other control frames wait to be sent (the
    /// application's reads can create them; the driver need only be woken
    /// then).
    pub fn has_pending_control(&self) -> bool {
        self.max_data_pending
            || self.max_streams_pending
            || !self.max_stream_data_pending.is_empty()
            || !self.control_queue.is_empty()
    }

    /// The next received message.
    pub fn poll_message(&mut self) -> Option<Message> {
        let m = Received::pop_message(&mut self.received)?;
        self.received_bytes -= message_queue_cost(m.payload.len());
        Some(m)
    }

    /// The oldest received messages: one, or a run of consecutive ones as they were read
    /// (which [`Session::poll_message`] would hand out one by one, in the same order).
    /// Cheaper per message where the caller queues them again (the tokio crate's inbox).
    pub fn poll_received(&mut self) -> Option<Received> {
        let r = self.received.pop_front()?;
        self.received_bytes -= r.queue_cost();
        Some(r)
    }

    /// What the received messages not yet taken count against
    /// `Config::message_receive_queue` (payloads plus [`MESSAGE_RECORD_BYTES`] each).
    pub fn received_message_bytes(&self) -> usize {
        self.received_bytes
    }

    /// Whether received messages fill `Config::message_receive_queue`: the
    /// driver should stop reading the transport until the application takes
    /// some (backpressure to the peer through TCP's window).
    /// Never true once the connection is closed: frames are then ignored,
    /// and the driver must read on to see the transport's end.
    pub fn receive_blocked(&self) -> bool {
        self.received_bytes >= self.config.message_receive_queue
            && !matches!(self.state, State::Closed { .. })
    }

    // ---------------------------------------------------------------------
    // Streams.

    fn local_stream_id(&self, index: u64) -> StreamId {
        index * 2 + u64::from(self.role == Role::Server)
    }

    fn is_local(&self, id: StreamId) -> bool {
        initiated_by_client(id) == (self.role == Role::Client)
    }

    fn new_stream(&self) -> StreamState {
        StreamState {
            send: SendHalf::new(self.peer_initial_max_stream_data),
            recv: RecvHalf::new(self.config.stream_receive_window),
            released_to: 0,
            released: false,
            write_blocked: false,
            read_blocked: false,
            unaccepted: false,
        }
    }

    /// Opens a stream. Fails with `StreamsBlocked` while the peer's limit is
    /// reached (wait for `Event::StreamsAvailable`).
    pub fn open_stream(&mut self) -> Result<StreamId, StreamError> {
        match &self.state {
            State::Open => {}
            State::Closing { .. } => return Err(StreamError::Closing),
            State::Closed { error, .. } => return Err(error.clone().into()),
        }
        if self.local_opened >= self.peer_max_streams {
            return Err(StreamError::StreamsBlocked);
        }
        let id = self.local_stream_id(self.local_opened);
        self.local_opened += 1;
        let s = self.new_stream();
        self.streams.insert(id, s);
        Ok(id)
    }

    /// The next stream the peer opened.
    pub fn accept_stream(&mut self) -> Option<StreamId> {
        while let Some(id) = self.incoming.pop_front() {
            if let Some(s) = self.streams.get_mut(&id) {
                s.unaccepted = false;
                return Some(id);
            }
        }
        None
    }

    fn stream_mut(&mut self, id: StreamId) -> Result<&mut StreamState, StreamError> {
        self.check_open()?;
        self.streams
            .get_mut(&id)
            .ok_or(StreamError::UnknownStream(id))
    }

    /// Buffers bytes for stream `id`; returns how many were taken (0 when
    /// the stream's send buffer is full: wait for `Event::StreamWritable`).
    pub fn stream_write(&mut self, id: StreamId, data: &[u8]) -> Result<usize, StreamError> {
        if let State::Closing { .. } = self.state {
            return Err(StreamError::Closing);
        }
        let limit = self.config.stream_send_buffer;
        let s = self.stream_mut(id)?;
        if let Some(code) = s.send.stopped {
            return Err(StreamError::Stopped { id, code });
        }
        if s.send.fin_requested || s.send.reset.is_some() {
            return Err(StreamError::SendClosed(id));
        }
        let n = s.send.write(data, limit);
        s.write_blocked = n < data.len();
        let priority = s.send.priority;
        if n > 0 {
            self.scheduler.activate(priority, Flow::Stream(id));
        }
        Ok(n)
    }

    /// Ends the send side of `id` after the bytes already written (FIN).
    pub fn stream_finish(&mut self, id: StreamId) -> Result<(), StreamError> {
        let s = self.stream_mut(id)?;
        if let Some(code) = s.send.stopped {
            return Err(StreamError::Stopped { id, code });
        }
        if s.send.fin_requested || s.send.reset.is_some() {
            return Err(StreamError::SendClosed(id));
        }
        s.send.fin_requested = true;
        let priority = s.send.priority;
        self.scheduler.activate(priority, Flow::Stream(id));
        Ok(())
    }

    /// Abandons the send side of `id`: unsent bytes are dropped and the peer
    /// gets RESET_STREAM with `code`.
    pub fn stream_reset(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        let s = self.stream_mut(id)?;
        if s.send.is_closed() {
            return Err(StreamError::SendClosed(id));
        }
        s.send.reset = Some(code);
        let final_size = s.send.discard();
        let priority = s.send.priority;
        self.scheduler.deactivate(priority, Flow::Stream(id));
        self.conn_blocked.remove(&id);
        self.control_queue.push_back(ControlFrame::ResetStream {
            stream: id,
            code,
            final_size,
        });
        self.maybe_remove_stream(id);
        Ok(())
    }

    /// Stops reading `id`: buffered bytes are dropped and the peer gets
    /// STOP_SENDING with `code`.
    pub fn stream_stop(&mut self, id: StreamId, code: u64) -> Result<(), StreamError> {
        let s = self.stream_mut(id)?;
        if s.recv.stopped || s.recv.done {
            return Ok(());
        }
        s.recv.stopped = true;
        s.recv.discard();
        let final_known = s.recv.final_size.is_some() || s.recv.reset.is_some();
        let highest = s.recv.highest;
        self.release(id, highest);
        if !final_known {
            self.control_queue
                .push_back(ControlFrame::StopSending { stream: id, code });
        }
        self.maybe_remove_stream(id);
        Ok(())
    }

    /// Sets the urgency class of stream `id`'s data.
    pub fn set_stream_priority(
        &mut self,
        id: StreamId,
        priority: Priority,
    ) -> Result<(), StreamError> {
        let s = self.stream_mut(id)?;
        let old = std::mem::replace(&mut s.send.priority, priority);
        if old != priority {
            self.scheduler.deactivate(old, Flow::Stream(id));
            self.scheduler.activate(priority, Flow::Stream(id));
        }
        Ok(())
    }

    /// Sets which connection carries stream `id`'s data when the session spans several.
    pub fn set_stream_path(&mut self, id: StreamId, path: PathPolicy) -> Result<(), StreamError> {
        self.stream_mut(id)?.send.path = Some(path);
        Ok(())
    }

    /// Gives back the memory of queues that hold nothing now (their capacity grew in a
    /// burst), as an idle connection should; queued items are kept.
    pub fn release_idle_memory(&mut self) {
        self.spare_flow_entries = VecDeque::new();
        for flow in self.message_flows.values_mut() {
            flow.entries.shrink_to_fit();
        }
        if self.received.is_empty() {
            self.received = VecDeque::new();
        }
        if self.events.is_empty() {
            self.events = VecDeque::new();
        }
        if self.control_queue.is_empty() {
            self.control_queue = VecDeque::new();
        }
    }

    /// The number the next queued message gets.
    pub fn next_message_number(&self) -> MessageNumber {
        self.next_message
    }

    /// Reads in-order bytes of stream `id`.
    /// Bytes that arrived before the connection closed stay readable; then
    /// the read fails with the connection's error.
    pub fn stream_read(
        &mut self,
        id: StreamId,
        out: &mut [u8],
    ) -> Result<ReadOutcome, StreamError> {
        let closed = self.error().cloned();
        let Some(s) = self.streams.get_mut(&id) else {
            return Err(match closed {
                Some(e) => StreamError::Connection(e),
                None => StreamError::UnknownStream(id),
            });
        };
        if let Some(code) = s.recv.reset {
            s.recv.done = true;
            self.maybe_remove_stream(id);
            return Err(StreamError::Reset { id, code });
        }
        if s.recv.stopped {
            return Err(StreamError::ReadClosed(id));
        }
        let outcome = s.recv.read(out);
        let to = s.recv.read_offset;
        match outcome {
            ReadOutcome::Data(n) => {
                self.stats.stream_bytes_received += n as u64;
                self.release(id, to);
                self.update_stream_window(id);
            }
            ReadOutcome::Blocked => {
                if let Some(e) = closed {
                    return Err(StreamError::Connection(e));
                }
                if let Some(s) = self.streams.get_mut(&id) {
                    s.read_blocked = true;
                }
            }
            ReadOutcome::Finished => self.maybe_remove_stream(id),
        }
        Ok(outcome)
    }

    /// Bytes of stream `id` that can be read now.
    pub fn stream_readable_bytes(&self, id: StreamId) -> usize {
        self.streams.get(&id).map_or(0, |s| s.recv.buffered())
    }

    /// The application is done with stream `id` (its handle was dropped):
    /// an unfinished send side is finished, an unread receive side stopped
    /// (code 0), and the stream's state is freed once both sides are done.
    pub fn stream_release(&mut self, id: StreamId) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        s.released = true;
        let finish = !s.send.fin_requested && !s.send.is_closed() && self.check_open().is_ok();
        if finish {
            let _ = self.stream_finish(id);
        }
        let _ = self.stream_stop(id, 0);
        self.maybe_remove_stream(id);
    }

    /// Releases connection credit of stream `id` up to offset `to`.
    fn release(&mut self, id: StreamId, to: u64) {
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        if to > s.released_to {
            self.conn_consumed += to - s.released_to;
            s.released_to = to;
        }
        // Give the peer more connection credit once half the window is used.
        let window = self.config.connection_receive_window;
        if self.conn_recv_max - self.conn_consumed <= window / 2 {
            self.conn_recv_max = self.conn_consumed + window;
            self.max_data_pending = true;
        }
    }

    fn update_stream_window(&mut self, id: StreamId) {
        let window = self.config.stream_receive_window;
        let Some(s) = self.streams.get_mut(&id) else {
            return;
        };
        let r = &mut s.recv;
        if r.final_size.is_none() && !r.stopped && r.max_data - r.read_offset <= window / 2 {
            r.max_data = r.read_offset + window;
            self.max_stream_data_pending.insert(id);
        }
    }

    fn maybe_remove_stream(&mut self, id: StreamId) {
        let Some(s) = self.streams.get(&id) else {
            return;
        };
        let send_done = s.send.is_closed() || s.send.stopped.is_some();
        let recv_done = s.recv.done || s.recv.stopped;
        if !(s.released && send_done && recv_done) {
            return;
        }
        self.streams.remove(&id);
        self.max_stream_data_pending.remove(&id);
        self.conn_blocked.remove(&id);
        if !self.is_local(id) {
            // A peer stream is gone: let the peer open another.
            self.local_max_streams += 1;
            self.max_streams_pending = true;
        }
    }

    /// Finds or implicitly opens the stream a peer frame refers to. `None`
    /// for a stream that existed and is gone (late frames are ignored).
    fn peer_stream(&mut self, id: StreamId) -> Result<Option<&mut StreamState>, ProtocolError> {
        if !self.streams.contains_key(&id) {
            let index = id / 2;
            if self.is_local(id) {
                if index >= self.local_opened {
                    return Err(ProtocolError::StreamState {
                        stream: id,
                        what: "frame for a local stream not yet opened",
                    });
                }
                return Ok(None);
            }
            if index < self.peer_opened {
                return Ok(None);
            }
            if index >= self.local_max_streams {
                return Err(ProtocolError::StreamLimit {
                    stream: id,
                    limit: self.local_max_streams,
                });
            }
            // Opening stream n opens every lower peer stream too (as QUIC,
            // RFC 9000 §3.2), so reordered first frames are harmless.
            for i in self.peer_opened..=index {
                let sid = i * 2 + u64::from(self.role == Role::Client);
                let mut s = self.new_stream();
                s.unaccepted = true;
                self.streams.insert(sid, s);
                self.incoming.push_back(sid);
            }
            self.peer_opened = index + 1;
            self.events.push_back(Event::StreamIncoming);
        }
        Ok(self.streams.get_mut(&id))
    }

    // ---------------------------------------------------------------------
    // Closing.

    /// Graceful close: everything queued is sent (messages may still
    /// expire), then APPLICATION_CLOSE with `code`; no new messages or
    /// writes are accepted meanwhile.
    pub fn close(&mut self, code: u64, reason: &[u8]) {
        if let State::Open = self.state {
            self.state = State::Closing {
                code,
                reason: reason.to_vec(),
            };
        }
    }

    /// Abort: queued data is discarded and APPLICATION_CLOSE with `code` is
    /// the only frame still sent.
    pub fn abort(&mut self, now: Instant, code: u64, reason: &[u8]) {
        self.enter_closed(
            now,
            ConnectionError::LocallyAborted(code),
            Some(ControlFrame::ApplicationClose {
                code,
                reason: reason.to_vec(),
            }),
            false,
        );
    }

    fn fail(&mut self, now: Instant, err: ProtocolError) {
        let frame = ControlFrame::Close {
            code: err.code(),
            reason: err.to_string().into_bytes(),
        };
        self.enter_closed(
            now,
            ConnectionError::ProtocolViolation(err),
            Some(frame),
            false,
        );
    }

    fn enter_closed(
        &mut self,
        now: Instant,
        error: ConnectionError,
        close_frame: Option<ControlFrame>,
        peer_done: bool,
    ) {
        if let State::Closed { .. } = self.state {
            return;
        }
        // Nothing queued will be sent now: each queued message is discarded, in number order.
        let mut discarded: Vec<(MessageNumber, usize)> = Vec::new();
        for (_, flow) in self.message_flows.drain() {
            for e in flow.entries {
                match e {
                    FlowEntry::Inline(m) => discarded.push((m.number, m.payload.len())),
                    FlowEntry::Tabled(n) => {
                        if let Some(m) = self.messages.remove(n) {
                            discarded.push((n, m.payload.len()));
                        }
                    }
                }
            }
        }
        discarded.sort_unstable_by_key(|&(n, _)| n);
        for (n, len) in discarded {
            self.queued_message_bytes -= message_queue_cost(len);
            self.report(n, MessageStatus::Discarded);
        }
        debug_assert!(
            self.messages.is_empty(),
            "every tabled message is in a flow"
        );
        self.deadlines.clear();
        self.squash.clear();
        self.control_queue.clear();
        self.scheduler = Scheduler::new(self.config.chunk_size);
        for s in self.streams.values_mut() {
            s.send.discard();
        }
        self.events.push_back(Event::ConnectionLost(error.clone()));
        self.state = State::Closed {
            error,
            close_frame,
            peer_done,
            drain_deadline: (!peer_done).then(|| now + self.config.drain_timeout),
        };
    }

    fn flushed(&self) -> bool {
        !self.has_queued_messages()
            && self.control_queue.is_empty()
            && !self.params_pending
            && self
                .streams
                .values()
                .all(|s| s.send.unsent() == 0 && (!s.send.fin_requested || s.send.is_closed()))
    }

    /// Which frame formats this session may use besides uCOBS (docs/wire.md §3): with
    /// `receive_plain` it announces that it reads plain frames (only a receiver reading the
    /// stream in order may), with `send_plain` it switches its sending direction to plain
    /// frames once the peer announces them (only a sender writing a plain byte stream, with
    /// no tagged queue and no inconsistent retransmissions, may). Set by whoever knows the
    /// substrate, before the first frame is sent; both are off by default.
    pub fn set_frame_formats(&mut self, receive_plain: bool, send_plain: bool) {
        if self.params_pending {
            self.formats.receive_plain = receive_plain;
        }
        self.formats.send_plain = send_plain;
    }

    /// Announces in PARAMS how this side reads numbered TLS records (docs/wire.md §5; bits of
    /// `control::record_numbers`). Set by the connection under TLS, before the first frame.
    pub fn announce_record_numbers(&mut self, bits: u64) {
        if self.params_pending {
            self.record_numbers = Some(bits);
        }
    }

    /// What the peer's PARAMS said about numbered records (docs/wire.md §5), once received.
    pub fn peer_record_numbers(&self) -> Option<u64> {
        self.peer_record_numbers
    }

    /// Tells the peer that a retransmission of the stream range `range` carried other
    /// records (RECORDS_REPLACED, docs/wire.md §5.1); queued ahead of data like every control
    /// frame. Only for a peer that reads numbered records out of order: ignored otherwise.
    pub fn announce_records_replaced(&mut self, range: std::ops::Range<u64>) {
        let wanted = self
            .peer_record_numbers
            .is_some_and(|b| b & control::record_numbers::OUT_OF_ORDER != 0);
        if wanted && range.start < range.end {
            self.control_queue.push_back(ControlFrame::RecordsReplaced {
                start: range.start,
                len: range.end - range.start,
            });
        }
    }

    /// Ranges the peer announced replaced (RECORDS_REPLACED), oldest first, for the record
    /// layer.
    pub fn take_records_replaced(&mut self) -> Vec<std::ops::Range<u64>> {
        self.records_replaced.drain(..).collect()
    }

    /// Plain frames both ways from the first frame, with no Switch and no announcement: for
    /// a session whose framing the layer below fixed before the stream began (inside TLS
    /// records, whose boundaries and AEAD already delimit and authenticate, docs/wire.md §4).
    /// A Switch from the peer is then a protocol violation. Call before the first frame is
    /// sent; later calls change nothing.
    pub fn use_plain_frames(&mut self) {
        if self.params_pending {
            self.formats = Formats::default();
            self.stats.send_format = FrameFormat::Plain;
            self.stats.receive_format = FrameFormat::Plain;
        }
    }

    // ---------------------------------------------------------------------
    // Transport side.

    /// The transport ended (EOF, reset or error) for `reason`. After our own
    /// CLOSE (or the peer's) any end of the transport just ends the drain.
    pub fn handle_transport_closed(&mut self, now: Instant, reason: TransportError) {
        let silent = !self.peer_frame_seen;
        match &mut self.state {
            State::Closed {
                error,
                peer_done,
                close_frame,
                ..
            } => {
                *peer_done = true;
                *close_frame = None;
                if silent {
                    note_unanswered_close(error, reason);
                }
            }
            _ => self.enter_closed(now, ConnectionError::Transport(reason), None, true),
        }
    }

    /// The layer below failed and told the peer itself (a TLS alert): the session ends with
    /// `reason` and sends nothing more, but drains like a graceful close — it waits for the
    /// peer's end, or the drain timeout — so that the driver goes on reading (and
    /// discarding) the peer's bytes in flight instead of closing the socket on them: a
    /// socket closed with unread bytes answers with a reset, which may destroy the alert
    /// before the peer reads it.
    pub fn handle_transport_failed(&mut self, now: Instant, reason: TransportError) {
        self.enter_closed(now, ConnectionError::Transport(reason), None, false);
    }

    /// A frame failed to decode. Over an in-order substrate this is a
    /// protocol violation (the stream is reliable, so the peer sent it).
    pub fn handle_decode_error(&mut self, now: Instant, err: FrameError) {
        if let State::Closed { .. } = self.state {
            return;
        }
        self.fail(now, ProtocolError::Frame(err));
    }

    /// The layer below found the peer breaking the protocol (e.g. a multipath session's
    /// acknowledgement of bytes never sent): the session fails with `err`, telling the peer.
    pub fn fail_protocol(&mut self, now: Instant, err: ProtocolError) {
        if let State::Closed { .. } = self.state {
            return;
        }
        self.fail(now, err);
    }

    /// Processes one frame from the peer. Frames may come in any order and
    /// more than once.
    pub fn handle_frame(&mut self, now: Instant, frame: Frame) {
        self.peer_frame_seen = true;
        if let State::Closed { .. } = self.state {
            return;
        }
        self.stats.frames_received += 1;
        if let Err(e) = self.process_frame(now, frame) {
            self.fail(now, e);
        }
    }

    /// [`Session::handle_frame`] for each message of `run` (consecutive MESSAGE frames as
    /// the in-order reader found them, [`squarepeg_framing::Decoded::Messages`]), in order:
    /// the same deliveries, duplicates dropped and counters. A run numbered consecutively
    /// from the duplicate window's end is queued whole, each message cut out of it only when
    /// taken ([`Session::poll_message`], [`Session::poll_received`]); any other is taken apart
    /// here.
    pub fn handle_message_run(&mut self, run: MessageRun) {
        self.peer_frame_seen = true;
        if let State::Closed { .. } = self.state {
            return;
        }
        self.stats.frames_received += run.len() as u64;
        if run.is_consecutive() && self.seen.insert_run(run.first_number(), run.len() as u64) {
            // The usual case on an in-order connection: every number new, checked at once.
            let cost = run.payload_len() + MESSAGE_RECORD_BYTES * run.len();
            self.queue_received_run(run, cost);
            return;
        }
        // Otherwise message by message (numbers out of order, as a sender's priorities make
        // them, or repeated by a peer), each taken out of the run in turn: linear in the
        // run's length whatever the numbers (cutting the run at each duplicate instead cost a
        // walk over the rest per duplicate, quadratic for a run of repeats).
        let mut run = run;
        while let Some((substream, number, payload)) = run.pop_front() {
            if !self.seen.insert(number) {
                self.stats.duplicate_messages += 1;
                continue;
            }
            self.stats.messages_received += 1;
            if self.received.is_empty() {
                self.events.push_back(Event::MessagesReceived);
            }
            self.received_bytes += message_queue_cost(payload.len());
            self.received.push_back(Received::One(Message {
                substream,
                number,
                payload,
            }));
        }
    }

    /// Queues the messages of `run` (checked against `seen`), which count `cost` against
    /// the receive queue.
    fn queue_received_run(&mut self, run: MessageRun, cost: usize) {
        if run.is_empty() {
            return;
        }
        self.stats.messages_received += run.len() as u64;
        if self.received.is_empty() {
            self.events.push_back(Event::MessagesReceived);
        }
        self.received_bytes += cost;
        self.received.push_back(Received::Run(run));
    }

    fn process_frame(&mut self, now: Instant, frame: Frame) -> Result<(), ProtocolError> {
        match frame.header {
            FrameHeader::Message { substream, number } => {
                if !self.seen.insert(number) {
                    self.stats.duplicate_messages += 1;
                    return Ok(());
                }
                self.stats.messages_received += 1;
                if self.received.is_empty() {
                    self.events.push_back(Event::MessagesReceived);
                }
                self.received_bytes += message_queue_cost(frame.payload.len());
                self.received.push_back(Received::One(Message {
                    substream,
                    number,
                    payload: frame.payload,
                }));
            }
            FrameHeader::StreamChunk {
                stream,
                offset,
                fin,
            } => self.handle_chunk(stream, offset, frame.payload, fin)?,
            FrameHeader::Padding => {}
            FrameHeader::Switch { format } => {
                // The frame reader already follows the switch; here it is checked: only to a
                // format we announced, and only once (docs/wire.md §3).
                if !self.formats.receive_plain
                    || FrameFormat::from_id(format) != Some(FrameFormat::Plain)
                    || self.stats.receive_format != FrameFormat::Ucobs
                {
                    return Err(ProtocolError::UnexpectedSwitch { format });
                }
                self.stats.receive_format = FrameFormat::Plain;
            }
            FrameHeader::Control => {
                let control = ControlFrame::decode(&frame.payload)?;
                self.handle_control(now, control)?;
            }
        }
        Ok(())
    }

    fn handle_chunk(
        &mut self,
        id: StreamId,
        offset: u64,
        data: Bytes,
        fin: bool,
    ) -> Result<(), ProtocolError> {
        let Some(s) = self.peer_stream(id)? else {
            return Ok(());
        };
        let grew = s.recv.insert(id, offset, data, fin)?;
        let discarding = s.recv.stopped || s.recv.reset.is_some();
        let wake = s.read_blocked && s.recv.is_readable();
        let highest = s.recv.highest;
        if wake {
            s.read_blocked = false;
        }
        self.conn_recv_highest += grew;
        if self.conn_recv_highest > self.conn_recv_max {
            return Err(ProtocolError::ConnectionFlowControl {
                total: self.conn_recv_highest,
                limit: self.conn_recv_max,
            });
        }
        if discarding {
            self.release(id, highest);
        }
        if wake {
            self.events.push_back(Event::StreamReadable(id));
        }
        Ok(())
    }

    fn handle_control(&mut self, now: Instant, control: ControlFrame) -> Result<(), ProtocolError> {
        match control {
            ControlFrame::Params(p) => self.handle_params(p),
            // A session over several connections: handled by the layer that owns the
            // connections (`squarepeg_connection::multipath`); over one, nothing to do.
            ControlFrame::PathAck { .. }
            | ControlFrame::PathProbe
            | ControlFrame::AddAddress { .. }
            | ControlFrame::RemoveAddress { .. } => {}
            ControlFrame::MaxData(max) => {
                if max > self.conn_send_max {
                    self.conn_send_max = max;
                    for id in std::mem::take(&mut self.conn_blocked) {
                        if let Some(s) = self.streams.get(&id) {
                            let p = s.send.priority;
                            self.scheduler.activate(p, Flow::Stream(id));
                        }
                    }
                }
            }
            ControlFrame::MaxStreamData { stream, max } => {
                if let Some(s) = self.peer_stream(stream)?
                    && max > s.send.max_data
                {
                    s.send.max_data = max;
                    let p = s.send.priority;
                    self.scheduler.activate(p, Flow::Stream(stream));
                }
            }
            ControlFrame::MaxStreams(max) => {
                if max > self.peer_max_streams {
                    self.peer_max_streams = max;
                    self.events.push_back(Event::StreamsAvailable);
                }
            }
            ControlFrame::ResetStream {
                stream,
                code,
                final_size,
            } => {
                let Some(s) = self.peer_stream(stream)? else {
                    return Ok(());
                };
                if final_size > s.recv.max_data {
                    return Err(ProtocolError::StreamFlowControl {
                        stream,
                        end: final_size,
                        limit: s.recv.max_data,
                    });
                }
                s.recv.set_final_size(stream, final_size)?;
                let grew = final_size - s.recv.highest;
                s.recv.highest = final_size;
                if s.recv.reset.is_none() && !s.recv.done {
                    s.recv.reset = Some(code);
                    s.recv.discard();
                    self.events.push_back(Event::StreamReadable(stream));
                }
                self.conn_recv_highest += grew;
                if self.conn_recv_highest > self.conn_recv_max {
                    return Err(ProtocolError::ConnectionFlowControl {
                        total: self.conn_recv_highest,
                        limit: self.conn_recv_max,
                    });
                }
                self.release(stream, final_size);
                self.maybe_remove_stream(stream);
            }
            ControlFrame::StopSending { stream, code } => {
                let Some(s) = self.peer_stream(stream)? else {
                    return Ok(());
                };
                if s.send.stopped.is_none() {
                    s.send.stopped = Some(code);
                    // RFC 9000 §3.5: answer STOP_SENDING with a reset.
                    if !s.send.is_closed() {
                        s.send.reset = Some(code);
                        let final_size = s.send.discard();
                        let p = s.send.priority;
                        self.scheduler.deactivate(p, Flow::Stream(stream));
                        self.conn_blocked.remove(&stream);
                        self.control_queue.push_back(ControlFrame::ResetStream {
                            stream,
                            code,
                            final_size,
                        });
                    }
                    self.events.push_back(Event::StreamWritable(stream));
                    self.maybe_remove_stream(stream);
                }
            }
            ControlFrame::Close { code, reason } => {
                let reason = String::from_utf8_lossy(&reason).into_owned();
                self.peer_closed(now, ConnectionError::PeerError { code, reason });
            }
            ControlFrame::ApplicationClose { code, reason } => {
                let reason = String::from_utf8_lossy(&reason).into_owned();
                self.peer_closed(now, ConnectionError::ApplicationClosed { code, reason });
            }
            ControlFrame::RecordsReplaced { start, len } => {
                // Only an out-of-order reader of numbered records asked for these.
                let asked = self
                    .record_numbers
                    .is_some_and(|b| b & control::record_numbers::OUT_OF_ORDER != 0);
                if !asked {
                    return Err(ProtocolError::UnexpectedControl {
                        frame_type: control::frame_type::RECORDS_REPLACED,
                    });
                }
                // Varints are below 2^62: the end cannot overflow.
                if self.records_replaced.len() < MAX_RECORDS_REPLACED {
                    self.records_replaced.push_back(start..start + len);
                } else {
                    self.stats.records_replaced_dropped += 1;
                }
            }
        }
        Ok(())
    }

    fn handle_params(&mut self, p: Params) {
        if p.record_numbers.is_some() {
            self.peer_record_numbers = p.record_numbers;
        }
        // The peer reads plain frames: switch our direction (docs/wire.md §3).
        if p.receive_formats
            .is_some_and(|f| f & FORMATS_WITH_PLAIN == FORMATS_WITH_PLAIN)
            && self.formats.send_plain
            && self.stats.send_format == FrameFormat::Ucobs
        {
            self.formats.switch_pending = true;
        }
        if let Some(v) = p.initial_max_data
            && v > self.conn_send_max
        {
            self.conn_send_max = v;
            for id in std::mem::take(&mut self.conn_blocked) {
                if let Some(s) = self.streams.get(&id) {
                    self.scheduler.activate(s.send.priority, Flow::Stream(id));
                }
            }
        }
        if let Some(v) = p.initial_max_stream_data
            && v > self.peer_initial_max_stream_data
        {
            self.peer_initial_max_stream_data = v;
            for (&id, s) in self.streams.iter_mut() {
                if v > s.send.max_data {
                    s.send.max_data = v;
                    self.scheduler.activate(s.send.priority, Flow::Stream(id));
                }
            }
        }
        if let Some(v) = p.initial_max_streams
            && v > self.peer_max_streams
        {
            self.peer_max_streams = v;
            self.events.push_back(Event::StreamsAvailable);
        }
    }

    fn peer_closed(&mut self, now: Instant, error: ConnectionError) {
        // Our CLOSE was sent: the peer's answer just ends the drain.
        self.enter_closed(now, error, None, true);
    }

    /// Appends the next frame to send to `buf` and returns its metadata, or
    /// `None` if there is nothing to send now. Control frames go first, then
    /// the scheduler's choice; expired messages are dropped first.
    pub fn poll_transmit(&mut self, now: Instant, buf: &mut Vec<u8>) -> Option<Transmit> {
        if let State::Closed { close_frame, .. } = &mut self.state {
            // PARAMS opens every stream, also one that closes before it sent anything (the
            // peer's CLOSE came first): the peer learns a squarepeg session took its bytes
            // (docs/wire.md §2.5).
            let frame = if std::mem::take(&mut self.params_pending) {
                self.params_frame()
            } else {
                close_frame.take()?
            };
            return self.transmit_control(&frame, buf);
        }
        self.expire(now);
        if self.formats.switch_pending && !self.params_pending {
            // After our PARAMS, which opens the stream (docs/wire.md §2.2). The Switch frame
            // itself is uCOBS; everything after it is plain.
            self.formats.switch_pending = false;
            let switch = FrameHeader::Switch {
                format: FrameFormat::Plain.id(),
            };
            let len = FrameFormat::Ucobs.encode(&switch, &[], buf).ok()?;
            self.stats.send_format = FrameFormat::Plain;
            self.stats.frames_sent += 1;
            return Some(Transmit {
                len,
                priority: None,
                content: TransmitContent::Control,
                path: PathPolicy::LowestRtt,
            });
        }
        if let Some(frame) = self.next_control() {
            return self.transmit_control(&frame, buf);
        }
        if let Some(t) = self.transmit_scheduled(buf) {
            self.stats.frames_sent += 1;
            return Some(t);
        }
        if let State::Closing { code, reason } = &self.state
            && self.flushed()
        {
            let frame = ControlFrame::ApplicationClose {
                code: *code,
                reason: reason.clone(),
            };
            self.enter_closed(now, ConnectionError::LocallyClosed, None, false);
            return self.transmit_control(&frame, buf);
        }
        None
    }

    /// Appends frames to `buf`, as repeated [`Session::poll_transmit`] calls
    /// would, until `buf` holds at least `limit` bytes or nothing is left to
    /// send; returns how many frames it appended. Faster per frame: while
    /// the scheduler's choice is a message flow with deficit left, its next
    /// messages are taken directly (nothing else can become due in between:
    /// `now` is fixed, so no message expires, and only the peer's frames or
    /// the application's calls create control frames or flows).
    pub fn poll_transmit_batch(&mut self, now: Instant, buf: &mut Vec<u8>, limit: usize) -> usize {
        self.transmit_batch(now, buf, limit, None).frames
    }

    /// Appends frames to `buf` that fit in `room` bytes, for a record layer that seals them
    /// where they are (one TLS record's plaintext): stream chunks are cut to the room left,
    /// and a message frame longer than the room left is not taken (it goes first in the next
    /// call) — except, with `first_may_overflow`, the first frame, which is appended whatever
    /// its length (a frame longer than a whole record must go somehow; the caller carries
    /// what overflows). Control frames are short and taken as they come, so they may
    /// overflow the room by a few bytes. Frames are the ones repeated
    /// [`Session::poll_transmit`] calls would append, in the same order.
    pub fn poll_transmit_fitted(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        room: usize,
        first_may_overflow: bool,
    ) -> FittedBatch {
        let end = buf.len() + room;
        self.transmit_batch(now, buf, end, Some(first_may_overflow))
    }

    /// Frames until `buf` holds `end` bytes; `fitted`: within that room
    /// ([`Session::poll_transmit_fitted`], with its `first_may_overflow`).
    fn transmit_batch(
        &mut self,
        now: Instant,
        buf: &mut Vec<u8>,
        end: usize,
        fitted: Option<bool>,
    ) -> FittedBatch {
        let mut batch = FittedBatch::default();
        while buf.len() < end {
            self.fit = fitted.map(|first_may_overflow| Fit {
                room: end - buf.len(),
                must_fit: batch.frames > 0 || !first_may_overflow,
                blocked: false,
            });
            let t = self.poll_transmit(now, buf);
            if self.fit.is_some_and(|f| f.blocked) {
                batch.next_does_not_fit = true;
            }
            let Some(t) = t else {
                break;
            };
            batch.frames += 1;
            let (Some(priority), TransmitContent::Message { substream, .. }) =
                (t.priority, t.content)
            else {
                continue;
            };
            let flow = Flow::Messages { substream };
            if self.fit.is_none() {
                batch.frames += self.transmit_message_run(priority, substream, buf, end);
                continue;
            }
            while buf.len() < end && self.scheduler.would_pick_again(priority, flow) {
                if let Some(fit) = &mut self.fit {
                    *fit = Fit {
                        room: end - buf.len(),
                        must_fit: true,
                        blocked: false,
                    };
                }
                let Some(t) = self.transmit_message(priority, substream, buf) else {
                    // The flow is empty (`poll_transmit` retires it), or its next message is
                    // for the next record.
                    batch.next_does_not_fit = self.fit.is_some_and(|f| f.blocked);
                    break;
                };
                self.scheduler.charge(priority, flow, t.len);
                self.stats.frames_sent += 1;
                batch.frames += 1;
            }
            if batch.next_does_not_fit {
                break;
            }
        }
        self.fit = None;
        batch
    }

    /// Appends what may go as TLS 1.3 early data (0-RTT), until `buf` holds at least
    /// `limit` bytes: PARAMS, which opens the stream, then messages marked
    /// [`MessageProps::safely_replayable`], the most urgent class first, each flow's
    /// replayable messages from its front (one queued behind a message that is not
    /// replayable waits with it, so a flow keeps its order). Everything else (other
    /// messages, streams, other control frames) waits for [`Session::poll_transmit`] after
    /// the handshake. Returns how many frames it appended.
    pub fn poll_transmit_early(&mut self, now: Instant, buf: &mut Vec<u8>, limit: usize) -> usize {
        if !matches!(self.state, State::Open) || self.formats.switch_pending {
            return 0;
        }
        self.expire(now);
        let mut frames = 0;
        if std::mem::take(&mut self.params_pending) {
            let params = self.params_frame();
            if self.transmit_control(&params, buf).is_some() {
                frames += 1;
            }
        }
        while buf.len() < limit {
            let messages = &self.messages;
            let next = self
                .message_flows
                .iter_mut()
                .filter_map(|(&(priority, substream), flow)| {
                    let (number, replayable) = match flow.front(|n| messages.contains(n))? {
                        FlowEntry::Inline(m) => (m.number, m.replayable),
                        FlowEntry::Tabled(n) => (*n, messages.get(*n)?.replayable),
                    };
                    replayable.then_some((priority.urgency(), number, priority, substream))
                })
                .min();
            let Some((_, _, priority, substream)) = next else {
                break;
            };
            if self.transmit_message(priority, substream, buf).is_none() {
                break;
            }
            self.stats.frames_sent += 1;
            frames += 1;
        }
        frames
    }

    fn params_frame(&self) -> ControlFrame {
        ControlFrame::Params(Params {
            initial_max_data: Some(self.config.connection_receive_window),
            initial_max_stream_data: Some(self.config.stream_receive_window),
            initial_max_streams: Some(self.local_max_streams),
            receive_formats: self.formats.receive_plain.then_some(FORMATS_WITH_PLAIN),
            record_numbers: self.record_numbers,
        })
    }

    fn next_control(&mut self) -> Option<ControlFrame> {
        if std::mem::take(&mut self.params_pending) {
            return Some(self.params_frame());
        }
        if let Some(f) = self.control_queue.pop_front() {
            return Some(f);
        }
        if std::mem::take(&mut self.max_data_pending) {
            return Some(ControlFrame::MaxData(self.conn_recv_max));
        }
        if std::mem::take(&mut self.max_streams_pending) {
            return Some(ControlFrame::MaxStreams(self.local_max_streams));
        }
        while let Some(id) = self.max_stream_data_pending.pop_first() {
            if let Some(s) = self.streams.get(&id) {
                return Some(ControlFrame::MaxStreamData {
                    stream: id,
                    max: s.recv.max_data,
                });
            }
        }
        None
    }

    fn transmit_control(&mut self, frame: &ControlFrame, buf: &mut Vec<u8>) -> Option<Transmit> {
        self.control_body.clear();
        // Our own control frames always encode: values come from varint
        // ranges we keep (credits never exceed 2^62 in practice).
        frame.encode(&mut self.control_body).ok()?;
        let len = self
            .stats
            .send_format
            .encode(&FrameHeader::Control, &self.control_body, buf)
            .ok()?;
        self.stats.frames_sent += 1;
        Some(Transmit {
            len,
            priority: None,
            content: TransmitContent::Control,
            path: PathPolicy::LowestRtt,
        })
    }

    fn transmit_scheduled(&mut self, buf: &mut Vec<u8>) -> Option<Transmit> {
        while let Some((priority, flow)) = self.scheduler.peek() {
            let sent = match flow {
                Flow::Messages { substream } => self.transmit_message(priority, substream, buf),
                Flow::Stream(id) => self.transmit_chunk(priority, id, buf),
            };
            match sent {
                Some(t) => {
                    self.scheduler.charge(priority, flow, t.len);
                    return Some(t);
                }
                // The flow's next frame is for the next record: it stays active.
                None if self.fit.is_some_and(|f| f.blocked) => return None,
                None => self.scheduler.deactivate(priority, flow),
            }
        }
        None
    }

    fn transmit_message(
        &mut self,
        priority: Priority,
        substream: u64,
        buf: &mut Vec<u8>,
    ) -> Option<Transmit> {
        // `remove_message(number, Sent)` for the flow's front, with the flow
        // looked up once: the message leaves it here.
        let messages = &self.messages;
        let key = (priority, substream);
        let flow = self.message_flows.get_mut(&key)?;
        let front = flow.front(|n| messages.contains(n))?;
        let number = front.number();
        let header = FrameHeader::Message { substream, number };
        if let Some(fit) = &mut self.fit
            && fit.must_fit
        {
            let payload_len = match front {
                FlowEntry::Inline(m) => m.payload.len(),
                FlowEntry::Tabled(n) => messages.get(*n)?.payload.len(),
            };
            if self
                .stats
                .send_format
                .frame_len(&header, payload_len)
                .is_some_and(|len| len > fit.room)
            {
                fit.blocked = true;
                return None;
            }
        }
        let entry = flow.pop_front()?;
        if flow.live == 0 {
            self.retire_flow(key);
        }
        let sent = self.take_sent(entry)?;
        // Message numbers and sub-streams below 2^62 always encode.
        let len = self
            .stats
            .send_format
            .encode_message(substream, number, &sent.payload, buf)
            .ok()?;
        Some(Transmit {
            len,
            priority: Some(priority),
            content: TransmitContent::Message {
                number,
                substream,
                deadline: sent.deadline,
                depends_on: sent.depends_on,
                squash_key: sent.squash_key,
            },
            path: sent.path,
        })
    }

    /// The queue's side of sending the entry just taken from its flow's front: its bytes and
    /// status, and for a tabled message its table entry, deadline, squash key and
    /// dependencies. `None` for a tabled entry no longer in the table.
    fn take_sent(&mut self, entry: FlowEntry) -> Option<SentMessage> {
        match entry {
            FlowEntry::Inline(m) => {
                self.dequeued(m.number, m.payload.len(), MessageStatus::Sent);
                Some(SentMessage {
                    payload: m.payload,
                    path: m.path,
                    deadline: None,
                    depends_on: None,
                    squash_key: None,
                })
            }
            FlowEntry::Tabled(number) => {
                let msg = self.messages.remove(number)?;
                self.forget_message(number, &msg, MessageStatus::Sent);
                self.pin_dependencies(msg.depends_on);
                Some(SentMessage {
                    payload: msg.payload,
                    path: msg.path,
                    deadline: msg.deadline,
                    depends_on: msg.depends_on,
                    squash_key: msg.squash_key,
                })
            }
        }
    }

    /// Takes the flow `key`, now without queued messages, out of the map; its queue's memory
    /// is kept for the next flow.
    fn retire_flow(&mut self, key: (Priority, u64)) {
        if let Some(flow) = self.message_flows.remove(&key) {
            self.keep_spare(flow.entries);
        }
    }

    /// Keeps the larger of `entries` (emptied) and the spare queue for the next flow to
    /// start with: a bulk sender's flow empties and refills at every batch, and growing a
    /// fresh queue to thousands of entries each time touched new memory at every step (page
    /// faults, copies).
    fn keep_spare(&mut self, mut entries: VecDeque<FlowEntry>) {
        if entries.capacity() > self.spare_flow_entries.capacity() {
            entries.clear();
            self.spare_flow_entries = entries;
        }
    }

    /// [`Session::transmit_message`] repeated while the scheduler would pick the flow
    /// (`priority`, `substream`) again and `buf` is shorter than `end`, with the flow looked
    /// up once and the scheduler charged once: the bulk of a batch of small messages. Not
    /// for a fitted batch, which checks each message's room. Returns the frames appended.
    fn transmit_message_run(
        &mut self,
        priority: Priority,
        substream: u64,
        buf: &mut Vec<u8>,
        end: usize,
    ) -> usize {
        let scheduled = Flow::Messages { substream };
        let Some(credit) = self.scheduler.credit_if_next(priority, scheduled) else {
            return 0;
        };
        let key = (priority, substream);
        // Out of the map while it sends: nothing below looks flows up.
        let Some(mut flow) = self.message_flows.remove(&key) else {
            return 0;
        };
        let start = buf.len();
        let mut frames = 0;
        while buf.len() < end && buf.len() - start < credit {
            let messages = &self.messages;
            if flow.front(|n| messages.contains(n)).is_none() {
                break;
            }
            let Some(entry) = flow.pop_front() else {
                break;
            };
            let number = entry.number();
            // Inline entries, the common case, without building a `SentMessage`.
            let payload = match entry {
                FlowEntry::Inline(m) => {
                    self.dequeued(number, m.payload.len(), MessageStatus::Sent);
                    m.payload
                }
                // `front` skipped the entries no longer in the table.
                tabled => match self.take_sent(tabled) {
                    Some(sent) => sent.payload,
                    None => continue,
                },
            };
            // Message numbers and sub-streams below 2^62 always encode.
            if self
                .stats
                .send_format
                .encode_message(substream, number, &payload, buf)
                .is_ok()
            {
                frames += 1;
            }
        }
        self.stats.frames_sent += frames as u64;
        self.scheduler
            .charge(priority, scheduled, buf.len() - start);
        if flow.live > 0 {
            self.message_flows.insert(key, flow);
        } else {
            self.keep_spare(flow.entries);
        }
        frames
    }

    fn transmit_chunk(
        &mut self,
        priority: Priority,
        id: StreamId,
        buf: &mut Vec<u8>,
    ) -> Option<Transmit> {
        let conn_credit = self.conn_send_max - self.conn_sent;
        let mut chunk_size = self.config.chunk_size;
        let limit = self.config.stream_send_buffer;
        let format = self.stats.send_format;
        let s = self.streams.get_mut(&id)?;
        if s.send.priority != priority {
            return None;
        }
        if let Some(fit) = &mut self.fit {
            // Cut to the room left (a chunk of the stream's end may be empty: it carries
            // the FIN).
            let header = FrameHeader::StreamChunk {
                stream: id,
                offset: s.send.offset,
                fin: false,
            };
            match format.payload_room(&header, fit.room) {
                Some(room) if room > 0 || s.send.unsent() == 0 => {
                    chunk_size = chunk_size.min(room);
                }
                _ => {
                    fit.blocked = true;
                    return None;
                }
            }
        }
        let Some((n, fin)) = s.send.next_chunk(conn_credit, chunk_size) else {
            if s.send.unsent() > 0 && conn_credit == 0 && !s.send.blocked_on_stream_credit() {
                self.conn_blocked.insert(id);
            }
            return None;
        };
        let offset = s.send.offset;
        let header = FrameHeader::StreamChunk {
            stream: id,
            offset,
            fin,
        };
        let len = self
            .stats
            .send_format
            .encode(&header, s.send.peek(n), buf)
            .ok()?;
        s.send.advance(n, fin);
        let path = s.send.path.unwrap_or(self.config.stream_path);
        self.conn_sent += n as u64;
        self.stats.stream_bytes_sent += n as u64;
        // Wake a blocked writer once half the buffer is free, not per chunk.
        if s.write_blocked && s.send.unsent() <= limit / 2 {
            s.write_blocked = false;
            self.events.push_back(Event::StreamWritable(id));
        }
        if fin {
            self.maybe_remove_stream(id);
        }
        Some(Transmit {
            len,
            priority: Some(priority),
            content: TransmitContent::StreamChunk {
                stream: id,
                offset,
                len: n,
                fin,
            },
            path,
        })
    }

    /// When [`Session::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.state {
            State::Closed {
                drain_deadline,
                peer_done: false,
                ..
            } => *drain_deadline,
            State::Closed { .. } => None,
            _ => self.deadlines.first().map(|&(t, _)| t),
        }
    }

    /// Runs timers: message expiry and the drain timer.
    pub fn handle_timeout(&mut self, now: Instant) {
        let silent = !self.peer_frame_seen;
        match &mut self.state {
            State::Closed {
                error,
                drain_deadline,
                peer_done,
                close_frame,
            } => {
                if drain_deadline.is_some_and(|t| t <= now) {
                    *peer_done = true;
                    *close_frame = None;
                    if silent {
                        note_unanswered_close(error, TransportError::PeerClosed);
                    }
                }
            }
            _ => self.expire(now),
        }
    }
}

/// A graceful close ended — by the transport's end for `reason`, or by the drain timeout
/// (as `PeerClosed`) — and the peer never sent a frame, not even PARAMS: whatever this side
/// sent, no squarepeg session took it, so `error` (the close's `LocallyClosed`) says so.
fn note_unanswered_close(error: &mut ConnectionError, reason: TransportError) {
    if matches!(error, ConnectionError::LocallyClosed) {
        *error = ConnectionError::Transport(match reason {
            TransportError::PeerClosed => TransportError::NothingReceived,
            other => other,
        });
    }
}
