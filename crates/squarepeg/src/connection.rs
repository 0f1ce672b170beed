//! The application's handle on a connection, and the state it shares with
//! the driver task.

use std::collections::{HashMap, VecDeque};
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;
use std::time::Instant;

use bytes::Bytes;
use squarepeg_connection::{SessionStats, TlsStats, UtcpStats};
use squarepeg_session::{
    ConnectionError, Event, Message, MessageNumber, MessageProps, MessageStatus, SendError,
    StreamError, StreamId, TransportError,
};
use tokio::sync::Notify;

use crate::core::{Core, Port};
use crate::staging::{Inbox, Outbox, Staged, Staging};
use crate::stream::Stream;

/// Bits of [`PendingWakes::lists`]: the waiter lists [`Shared::dispatch`] notifies.
const LIST_STATUSES: u8 = 0;
const LIST_MESSAGES: u8 = 1;
const LIST_INCOMING: u8 = 2;
const LIST_STREAMS_AVAILABLE: u8 = 3;
const LIST_SEND_SPACE: u8 = 4;
const LIST_PATHS_CHANGED: u8 = 5;

/// State shared by the driver and the application's handles.
pub(crate) struct Shared {
    state: Mutex<State>,
    /// Received messages taken out of the session in batches (by the driver as it hands
    /// them over, or by a receive call that found this empty), in order, ahead of those
    /// still in the session: the application's receive calls take them under this lock
    /// alone instead of the connection's (see `staging`). Filled only with the connection
    /// locked (lock order: state, then this).
    received: Mutex<Inbox>,
    /// Messages the application sent, on their way into the session (see `staging`). Lock
    /// order: state, then this.
    outbox: Mutex<Outbox>,
    /// Payload bytes sent and received since the application's calls last spent a unit of
    /// their task's cooperative budget (see [`spend_budget`]).
    send_budget: AtomicUsize,
    recv_budget: AtomicUsize,
    /// Application → driver: something to send or room to read (the single connection's
    /// driver; see [`Shared::wake_driver`]).
    driver: Arc<Notify>,
    /// A multipath session: each path's driver's own (all are woken).
    path_drivers: Mutex<Vec<(Port, Arc<Notify>)>>,
    /// A multipath session: its connections changed (a path event to act on).
    pub(crate) paths_changed: Notify,
    /// The core is a multipath session (several drivers).
    multipath: bool,
    messages: Notify,
    incoming: Notify,
    streams_available: Notify,
    send_space: Notify,
    statuses: Notify,
    finished: Notify,
    /// The TLS handshake finished (or the connection ended).
    established: Notify,
    pub(crate) local: SocketAddr,
    pub(crate) remote: SocketAddr,
}

pub(crate) struct State {
    /// The sans-IO connection: session, frame codec, substrate adapter.
    pub(crate) conn: Core,
    pub(crate) read_wakers: HashMap<StreamId, Waker>,
    pub(crate) write_wakers: HashMap<StreamId, Waker>,
    statuses: StatusQueue,
    statuses_lagged: u64,
    /// The driver has stopped; the socket is closed.
    pub(crate) driver_done: bool,
    /// The `TCP_NOTSENT_LOWAT` in force (kernel TCP), as the driver set it.
    pub(crate) notsent_lowat: Option<u32>,
    /// The core's establishment (the end of the TLS handshake) was told to waiters.
    established_told: bool,
    /// The outbox's messages while they move into the session (kept for its capacity).
    staged: VecDeque<Staged>,
    /// What the outbox was last told about the session taking messages.
    outbox_open: bool,
    /// What the driver's own buffers hold (its write batch, its TLS read buffer), as it last
    /// said (`ConnectionStats::buffer_bytes`).
    pub(crate) driver_buffer_bytes: usize,
    /// Messages the outbox had accepted when the session stopped taking any.
    staged_discarded: u64,
    /// Wake-ups [`Shared::dispatch`] found due, done once the lock is let go.
    wakes: PendingWakes,
    /// The driver found the core's receiver lent to an application's call (an inline read,
    /// [`Shared::read_inline`]) and waits to be woken when it is back.
    pub(crate) driver_waits_for_receiver: bool,
    /// The driver has read the peer's bytes: the socket is connected (a Fast Open client's
    /// may not be before), so an application's call may read it too.
    pub(crate) peer_bytes_read: bool,
    /// A single kernel-TCP connection with plain frames: its socket, which the
    /// application's receive calls may read themselves ([`Shared::read_inline`]), until
    /// the driver stops (which closes it).
    pub(crate) inline_socket: Option<Arc<tokio::net::TcpStream>>,
    /// Reads of the socket made by the application's receive calls.
    pub(crate) reads_by_application: u64,
    /// The application's receive calls read the socket (one of them read it, or found it
    /// empty and waited for it, since the driver last took the reading back): the driver
    /// does not wait for the socket's readiness meanwhile, only checks now and then that
    /// they still read (see `driver::READ_DUTY_CHECK`). Each read the driver makes instead is a wake-up of the
    /// driver's thread and a hand-over to the application's (measured with `message_profile
    /// peg 16384`: three quarters of the reads, and most of the context switches, were the
    /// driver's while the application was busy with the messages of the read before).
    pub(crate) application_reads: bool,
    /// Receive calls waiting for the socket's readiness themselves (they read when it is
    /// readable).
    pub(crate) application_waits_readable: usize,
    /// The driver left the reading to the receive calls waiting for readiness, without a
    /// timer to check on them: the last of them to stop waiting wakes it.
    pub(crate) driver_relies_on_waiters: bool,
    /// Times the driver went back to reading because the application had stopped.
    pub(crate) reads_taken_back: u64,
}

/// Wake-ups owed to tasks waiting on the connection, collected while it is locked and done
/// by [`StateGuard`] after it unlocks: a task woken while the lock is still held would
/// only block on it at once (a futex wait and a futex wake more per hand-over: with 1 KiB
/// messages, half of the futex calls of a transfer went to the receiving application
/// woken by the driver's hand-over and then blocking on the driver's lock).
#[derive(Default)]
pub(crate) struct PendingWakes {
    /// Which of the waiter lists to notify (bits `LIST_*`, see [`Shared::notify_lists`]).
    lists: u8,
    wakers: Vec<Waker>,
    /// A multipath session's paths whose drivers must poll them.
    paths: Vec<squarepeg_connection::PathId>,
}

/// The connection locked ([`Shared::lock`]); on drop it unlocks, then does the wake-ups
/// collected meanwhile ([`PendingWakes`]).
pub(crate) struct StateGuard<'a> {
    guard: ManuallyDrop<MutexGuard<'a, State>>,
    shared: &'a Shared,
}

impl Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.guard
    }
}

impl DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.guard
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let lists = std::mem::take(&mut self.guard.wakes.lists);
        let paths = std::mem::take(&mut self.guard.wakes.paths);
        // A few wakers (the usual: a stream's reader or writer) move out without giving up
        // the list's memory; more take the list along.
        let mut few: [Option<Waker>; 4] = Default::default();
        let mut many = Vec::new();
        let pending = &mut self.guard.wakes.wakers;
        if pending.len() <= few.len() {
            for (slot, w) in few.iter_mut().zip(pending.drain(..)) {
                *slot = Some(w);
            }
        } else {
            many = std::mem::take(pending);
        }
        // SAFETY: `guard` is not used after this (we are in `drop`).
        unsafe { ManuallyDrop::drop(&mut self.guard) };
        self.shared.notify_lists(lists);
        for w in few.into_iter().flatten().chain(many) {
            w.wake();
        }
        for id in paths {
            self.shared.wake_path(Port::Path(id));
        }
    }
}

impl State {
    /// Whether the core's in-order receiver is in the core (not out for a read).
    pub(crate) fn receiver_available(&self) -> bool {
        match &self.conn {
            Core::Single(c) => c.receiver_available(),
            Core::Multi(_) => false,
        }
    }

    /// Whether a message queued now with `props` must wake the driver. The
    /// kernel-TCP driver takes messages until the session's queue is empty
    /// whenever it writes (and comes back on its own while the socket is
    /// full), so only a message that finds the queue empty needs to wake
    /// it: one wake-up per burst instead of an atomic handshake with the
    /// driver's core per message. A message with a lifetime may bring the
    /// earliest deadline, which the driver's timer must learn; and tagged
    /// writes leave only as the TCP's window allows. Both wake it.
    fn driver_needs_wake(&self, props: &MessageProps) -> bool {
        self.conn.sends_tagged()
            || props.lifetime.is_some()
            || !self.conn.session().has_queued_messages()
    }
}

impl Shared {
    pub(crate) fn new(
        conn: impl Into<Core>,
        status_limit: usize,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Self {
        let conn: Core = conn.into();
        let multipath = conn.multi().is_some();
        let session = conn.session();
        let outbox = Outbox::new(
            session.next_message_number(),
            session.queued_message_bytes(),
            session.config().message_send_queue,
            conn.sends_tagged(),
            !multipath,
        );
        Self {
            multipath,
            state: Mutex::new(State {
                conn,
                read_wakers: HashMap::new(),
                write_wakers: HashMap::new(),
                statuses: StatusQueue::new(status_limit),
                statuses_lagged: 0,
                driver_done: false,
                notsent_lowat: None,
                established_told: false,
                staged: VecDeque::new(),
                outbox_open: true,
                driver_buffer_bytes: 0,
                staged_discarded: 0,
                wakes: PendingWakes::default(),
                driver_waits_for_receiver: false,
                peer_bytes_read: false,
                inline_socket: None,
                reads_by_application: 0,
                application_reads: false,
                application_waits_readable: 0,
                driver_relies_on_waiters: false,
                reads_taken_back: 0,
            }),
            received: Mutex::new(Inbox::default()),
            outbox: Mutex::new(outbox),
            send_budget: AtomicUsize::new(0),
            recv_budget: AtomicUsize::new(0),
            driver: Arc::new(Notify::new()),
            path_drivers: Mutex::new(Vec::new()),
            paths_changed: Notify::new(),
            messages: Notify::new(),
            incoming: Notify::new(),
            streams_available: Notify::new(),
            send_space: Notify::new(),
            statuses: Notify::new(),
            finished: Notify::new(),
            established: Notify::new(),
            local,
            remote,
        }
    }

    /// Lets the application's receive calls read `socket` themselves (see
    /// [`Self::read_inline`]).
    pub(crate) fn allow_inline_reads(&self, socket: Arc<tokio::net::TcpStream>) {
        self.lock().inline_socket = Some(socket);
    }

    /// A receive call found nothing received: rather than wait for the driver to read and
    /// wake it (a thread wake-up per read when the application keeps up with the peer), it
    /// reads the socket itself if the core's receiver is free, as an application using the
    /// socket directly would. While the application reads, the driver leaves the reading
    /// to it ([`State::application_reads`]); it reads again whenever the application does
    /// not (it waits on the socket's readiness, taking the receiver only for the read).
    fn read_inline(&self) -> InlineRead {
        let (socket, mut receiver, timeout_before) = {
            let mut st = self.lock();
            if !st.peer_bytes_read {
                return InlineRead::Unavailable;
            }
            let Some(socket) = st.inline_socket.clone() else {
                return InlineRead::Unavailable;
            };
            let timeout = st.conn.poll_timeout();
            let Some(core) = st.conn.single_mut() else {
                return InlineRead::Unavailable;
            };
            if !core.wants_read() || !core.is_established() {
                return InlineRead::Unavailable;
            }
            let Some(r) = core.take_receiver() else {
                return InlineRead::Unavailable;
            };
            (socket, r, timeout)
        };
        let result = socket.try_read(receiver.buffer());
        if let Ok(n @ 1..) = result {
            // Decoded outside the lock, as the driver does.
            receiver.filled(n);
        }
        let now = Instant::now();
        let mut st = self.lock();
        let mut wake_driver = std::mem::take(&mut st.driver_waits_for_receiver);
        if let Some(core) = st.conn.single_mut() {
            core.return_receiver(now, receiver);
        }
        match &result {
            Ok(1..) => {
                st.reads_by_application += 1;
                st.application_reads = true;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            // The end of the peer's stream stays readable: the driver reads it again and
            // ends the connection as for any read.
            Ok(0) => {
                st.application_reads = false;
                wake_driver = true;
            }
            // An error is reported once (a reset's): the connection ends with it here.
            Err(e) => {
                st.conn
                    .handle_transport_closed(Port::Single, now, TransportError::from_io(e));
                st.application_reads = false;
                wake_driver = true;
            }
        }
        let nothing_read = matches!(&result, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        if !nothing_read {
            // What the read may have given the driver to do: frames to answer (flow credit,
            // a CLOSE), or an earlier timer; and what it gave the waiters.
            let session = st.conn.session();
            if session.has_pending_control() || session.is_closing() || session.error().is_some() {
                wake_driver = true;
            }
            let timeout = st.conn.poll_timeout();
            if timeout.is_some_and(|t| timeout_before.is_none_or(|b| t < b)) {
                wake_driver = true;
            }
            self.dispatch(&mut st);
        }
        drop(st);
        if wake_driver {
            self.wake_driver();
        }
        match result {
            Ok(1..) => InlineRead::Read(socket),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => InlineRead::Empty(socket),
            _ => InlineRead::Unavailable,
        }
    }

    /// Wakes the driver(s): the application queued something or made room.
    pub(crate) fn wake_driver(&self) {
        if !self.multipath {
            // The common case, on every send: one driver, no lock.
            self.driver.notify_one();
            return;
        }
        let drivers = self.path_drivers.lock().unwrap_or_else(|e| e.into_inner());
        for (_, n) in drivers.iter() {
            n.notify_one();
        }
    }

    /// Wakes the driver of one path of a multipath session (it has output now).
    pub(crate) fn wake_path(&self, port: Port) {
        let drivers = self.path_drivers.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = drivers.iter().find(|(p, _)| *p == port) {
            n.notify_one();
        }
    }

    /// The `Notify` the driver of `port` waits on.
    pub(crate) fn driver_notify(&self, port: Port) -> Arc<Notify> {
        match port {
            Port::Single => self.driver.clone(),
            Port::Path(_) => {
                let n = Arc::new(Notify::new());
                self.path_drivers
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((port, n.clone()));
                n
            }
        }
    }

    /// Whether a path driver runs (a multipath session).
    pub(crate) fn has_path_drivers(&self) -> bool {
        !self
            .path_drivers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty()
    }

    /// The driver of `port` has stopped (its socket is closed).
    pub(crate) fn driver_stopped(&self, st: &mut State, port: Port) {
        let none_left = {
            let mut drivers = self.path_drivers.lock().unwrap_or_else(|e| e.into_inner());
            drivers.retain(|(p, _)| *p != port);
            drivers.is_empty()
        };
        // A multipath session is done once its last driver stopped after it ended (with no
        // path left it waits for joins otherwise).
        if port == Port::Single || (none_left && st.conn.session().error().is_some()) {
            st.driver_done = true;
        }
        self.dispatch(st);
        self.paths_changed.notify_waiters();
        if st.driver_done {
            self.wake_all(st);
        }
    }

    /// Locks the connection. Messages waiting in the outbox move into the session first, so
    /// whoever holds the lock sees every message sent before.
    pub(crate) fn lock(&self) -> StateGuard<'_> {
        // A panic while holding the lock leaves the session in an unknown
        // state; carrying on with it is still better than poisoning every
        // later call of the application.
        let mut st = StateGuard {
            guard: ManuallyDrop::new(self.state.lock().unwrap_or_else(|e| e.into_inner())),
            shared: self,
        };
        if self.multipath {
            // Its outbox is off (`Outbox::new`): nothing to move.
            return st;
        }
        let moved = {
            let st = &mut *st;
            let mut outbox = self.outbox();
            let any = !outbox.messages.is_empty();
            if any {
                outbox.take_all(&mut st.staged, st.conn.session().queued_message_bytes());
            }
            any
        };
        if moved {
            // Outside the outbox's lock: the application goes on sending meanwhile.
            self.move_staged(&mut st);
        }
        st
    }

    /// The connection is idle (`st` locked): the queues between the application and the
    /// driver give back the memory they grew to in a burst, if they are empty.
    pub(crate) fn release_idle_queues(&self, st: &mut State) {
        if st.staged.is_empty() {
            st.staged = VecDeque::new();
        }
        self.outbox().release_idle();
        self.received().release_idle();
    }

    fn outbox(&self) -> MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends a message through the outbox, waking the driver if it must be; hands the
    /// payload back if the message needs the session (see [`Staging::Locked`]).
    fn stage(&self, payload: Bytes, props: &MessageProps) -> Result<MessageNumber, Bytes> {
        // The outbox's lock ends with this statement, before the wake-up.
        let staged = self.outbox().stage(payload, props, queue_time(props));
        match staged {
            Staging::Staged { number, wake } => {
                if wake {
                    self.wake_driver();
                }
                Ok(number)
            }
            Staging::Locked(payload) => Err(payload),
        }
    }

    /// Queues the messages taken from the outbox in the session (`st` locked).
    fn move_staged(&self, st: &mut State) {
        let Some(first) = st.staged.front().map(|m| m.number) else {
            return;
        };
        debug_assert_eq!(
            first,
            st.conn.session().next_message_number(),
            "outbox and session numbers agree"
        );
        let count = st.staged.len() as u64;
        let (taken, refused) = st.conn.session_mut().send_admitted_messages(
            st.staged
                .drain(..)
                .map(|m| (m.queued_at, m.payload, m.props)),
        );
        if refused.is_none() {
            return;
        }
        // The session closed after the outbox took them: the messages from the refused one
        // on are discarded, as ones queued in the session would have been (the outbox
        // numbers consecutively).
        for number in first + taken as u64..first + count {
            st.staged_discarded += 1;
            if st.statuses.limit > 0 && st.statuses.push(number, MessageStatus::Discarded) {
                st.statuses_lagged += 1;
            }
        }
        self.statuses.notify_waiters();
    }

    /// Queues a message in the session itself (`st` locked): one the outbox would not take.
    /// Holds the outbox's lock meanwhile, so that no message is numbered in between. If the
    /// send queue is full (with what the outbox held), hands the payload back.
    fn queue_directly(
        &self,
        st: &mut State,
        payload: Bytes,
        props: MessageProps,
    ) -> Result<Result<MessageNumber, SendError>, Bytes> {
        let mut outbox = self.outbox();
        if !outbox.messages.is_empty() {
            outbox.take_all(&mut st.staged, st.conn.session().queued_message_bytes());
            self.move_staged(st);
        }
        let session = st.conn.session();
        // A closing or closed session answers with its error, not with a full queue.
        let taking = session.error().is_none() && !session.is_closing();
        if taking && !st.conn.session_mut().message_queue_has_room(payload.len()) {
            return Err(payload);
        }
        let r = st
            .conn
            .session_mut()
            .send_message(queue_time(&props), payload, props);
        let session = st.conn.session();
        outbox.resync(
            session.next_message_number(),
            session.queued_message_bytes(),
        );
        Ok(r)
    }

    /// After the driver took output (`st` locked): the session's queue is shorter, which the
    /// outbox's room check should know.
    pub(crate) fn note_transmitted(&self, st: &State) {
        let session = st.conn.session();
        let mut outbox = self.outbox();
        let next = session.next_message_number();
        outbox.resync(next, session.queued_message_bytes());
    }

    /// Hands session events to whoever waits for them. Called with the
    /// state locked.
    pub(crate) fn dispatch(&self, st: &mut State) {
        if let Some(m) = st.conn.multi_mut() {
            let paths = m.take_paths_to_poll();
            let changed = m.take_path_event_signal();
            if st.wakes.paths.is_empty() {
                st.wakes.paths = paths;
            } else {
                st.wakes.paths.extend(paths);
            }
            if changed {
                st.wakes.lists |= 1 << LIST_PATHS_CHANGED;
            }
        }
        let open = {
            let session = st.conn.session();
            session.error().is_none() && !session.is_closing()
        };
        if open != st.outbox_open {
            st.outbox_open = open;
            self.outbox().set_open(open);
        }
        if !st.conn.has_events() {
            // The common case on every send and every driver round.
            return;
        }
        // Each waiter list is notified at most once per call: a batch of
        // frames produces one wake-up, not one per message. The wake-ups
        // wait for the lock's release (`StateGuard`).
        while let Some(event) = st.conn.poll_event() {
            match event {
                Event::MessageStatus { numbers, status } => {
                    if st.statuses.limit == 0 {
                        continue;
                    }
                    st.statuses_lagged += st.statuses.push_run(numbers, status);
                    st.wakes.lists |= 1 << LIST_STATUSES;
                }
                Event::MessagesReceived => {
                    self.fill_inbox(st);
                    st.wakes.lists |= 1 << LIST_MESSAGES;
                }
                Event::StreamIncoming => st.wakes.lists |= 1 << LIST_INCOMING,
                Event::StreamsAvailable => st.wakes.lists |= 1 << LIST_STREAMS_AVAILABLE,
                Event::SendQueueAvailable => st.wakes.lists |= 1 << LIST_SEND_SPACE,
                Event::StreamReadable(id) => {
                    if let Some(w) = st.read_wakers.remove(&id) {
                        st.wakes.wakers.push(w);
                    }
                }
                Event::StreamWritable(id) => {
                    if let Some(w) = st.write_wakers.remove(&id) {
                        st.wakes.wakers.push(w);
                    }
                }
                Event::ConnectionLost(_) => self.wake_all(st),
            }
        }
    }

    /// Notifies the waiter lists whose bits are set in `lists` (see [`PendingWakes`]).
    fn notify_lists(&self, lists: u8) {
        if lists == 0 {
            return;
        }
        let all = [
            &self.statuses,
            &self.messages,
            &self.incoming,
            &self.streams_available,
            &self.send_space,
            &self.paths_changed,
        ];
        for (i, notify) in all.into_iter().enumerate() {
            if lists & (1 << i) != 0 {
                notify.notify_waiters();
            }
        }
    }

    /// After bytes were handed to the core: wakes those waiting for the end of the TLS
    /// handshake once it has ended.
    pub(crate) fn note_established(&self, st: &mut State) {
        if !st.established_told && st.conn.is_established() {
            st.established_told = true;
            self.established.notify_waiters();
        }
    }

    pub(crate) fn wake_all(&self, st: &mut State) {
        for (_, w) in st.read_wakers.drain().chain(st.write_wakers.drain()) {
            w.wake();
        }
        for n in [
            &self.messages,
            &self.incoming,
            &self.streams_available,
            &self.send_space,
            &self.statuses,
            &self.finished,
            &self.established,
        ] {
            n.notify_waiters();
        }
    }

    fn received(&self) -> MutexGuard<'_, Inbox> {
        self.received.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The next message of the inbox, for a receive call (its bytes count against the
    /// call's task budget). The inbox's lock is let go on return: the callers go on to lock
    /// the connection, whose lock comes first.
    fn pop_received(&self) -> Option<Message> {
        let m = self.received().pop()?;
        self.recv_budget
            .fetch_add(m.payload.len(), Ordering::Relaxed);
        Some(m)
    }

    /// Moves received messages from the session into the inbox while it has room (`st`
    /// locked).
    fn fill_inbox(&self, st: &mut State) {
        let mut inbox = self.received();
        while inbox.has_room() {
            let Some(r) = st.conn.session_mut().poll_received() else {
                break;
            };
            inbox.push(r);
        }
    }

    /// The oldest received message, from the inbox or else from the
    /// session (`st` locked), which then refills the inbox. Returns the
    /// message and whether the session's receive queue was full before
    /// (the driver then waits for room and must be woken).
    fn take_received(&self, st: &mut State) -> Option<(Message, bool)> {
        if let Some(m) = self.received().pop() {
            return Some((m, false));
        }
        let was_blocked = st.conn.session().receive_blocked();
        let m = st.conn.session_mut().poll_message()?;
        self.fill_inbox(st);
        Some((m, was_blocked))
    }

    /// Waits on `notify` until `f` returns a value.
    async fn wait<T>(
        &self,
        notify: impl Fn(&Self) -> &Notify,
        mut f: impl FnMut(&mut State) -> Option<T>,
    ) -> T {
        // Fast path: no waiter registration when the answer is ready.
        if let Some(v) = f(&mut self.lock()) {
            return v;
        }
        loop {
            let notified = notify(self).notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut st = self.lock();
                if let Some(v) = f(&mut st) {
                    return v;
                }
            }
            notified.await;
        }
    }
}

/// What [`Shared::read_inline`] did.
enum InlineRead {
    /// Bytes were read into the core (the socket may have more).
    Read(Arc<tokio::net::TcpStream>),
    /// The socket had nothing to read.
    Empty(Arc<tokio::net::TcpStream>),
    /// Nothing was read, and the socket is not the application's to read now (the
    /// driver has the receiver, the connection is not established or has ended, the core
    /// wants no reads): a receive call waits to be woken.
    Unavailable,
}

/// A receive call waiting for the socket's readiness ([`State::application_waits_readable`]),
/// counted until it stops waiting, also when its future is dropped.
struct WaitingReadable<'a>(&'a Shared);

impl<'a> WaitingReadable<'a> {
    fn new(shared: &'a Shared, st: &mut State) -> Self {
        st.application_waits_readable += 1;
        WaitingReadable(shared)
    }
}

impl Drop for WaitingReadable<'_> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.application_waits_readable -= 1;
        // A driver that left the reading to waiting calls without a timer must learn that
        // none waits any longer, to check on the application from now on.
        let wake =
            st.application_waits_readable == 0 && std::mem::take(&mut st.driver_relies_on_waiters);
        drop(st);
        if wake {
            self.0.wake_driver();
        }
    }
}

/// Message statuses waiting for the application, oldest first, as runs of
/// consecutive message numbers with the same status: a steady stream of
/// messages sent in order is one run whose count grows, instead of an
/// entry per message in a queue as long as the limit that nobody may ever
/// read (with the default limit, 1.5 MiB written once per 65 536 messages,
/// a cache miss every few messages).
struct StatusQueue {
    /// (first number, count, status); counts are at least 1.
    runs: VecDeque<(MessageNumber, u64, MessageStatus)>,
    len: usize,
    limit: usize,
}

impl StatusQueue {
    fn new(limit: usize) -> Self {
        Self {
            runs: VecDeque::new(),
            len: 0,
            limit,
        }
    }

    /// Appends a status; when the queue is full, drops the oldest one
    /// first and returns true.
    fn push(&mut self, number: MessageNumber, status: MessageStatus) -> bool {
        self.push_run(number..number.saturating_add(1), status) > 0
    }

    /// Appends the statuses of `numbers` (all `status`), oldest first; while the queue is
    /// full, drops the oldest statuses (queued ones first, then the run's own) and returns
    /// how many it dropped.
    fn push_run(&mut self, numbers: std::ops::Range<MessageNumber>, status: MessageStatus) -> u64 {
        let count = numbers.end.saturating_sub(numbers.start);
        // Of the run, only the newest `limit` can stay.
        let keep = count.min(self.limit as u64);
        let mut dropped = count - keep;
        while self.len as u64 + keep > self.limit as u64 {
            let Some((first, n, _)) = self.runs.front_mut() else {
                break;
            };
            let over = self.len as u64 + keep - self.limit as u64;
            let k = over.min(*n);
            if k == *n {
                self.runs.pop_front();
            } else {
                *first += k;
                *n -= k;
            }
            self.len -= k as usize;
            dropped += k;
        }
        if keep == 0 {
            return dropped;
        }
        let start = numbers.end - keep;
        match self.runs.back_mut() {
            Some((first, n, s)) if *s == status && first.checked_add(*n) == Some(start) => {
                *n += keep;
            }
            _ => self.runs.push_back((start, keep, status)),
        }
        self.len += keep as usize;
        dropped
    }

    fn pop(&mut self) -> Option<(MessageNumber, MessageStatus)> {
        let (first, count, status) = self.runs.front_mut()?;
        let taken = (*first, *status);
        if *count == 1 {
            self.runs.pop_front();
        } else {
            *first += 1;
            *count -= 1;
        }
        self.len -= 1;
        Some(taken)
    }
}

/// Whether a call about to move a message of `len` bytes spends a unit of its task's
/// cooperative budget (`counter`: bytes since it last did; a receive call passes 0 and adds
/// the length after it took a message). An application that sends or
/// receives in a tight loop never waits, so without the budget the driver it wakes (in the
/// worker's unstealable LIFO slot) would not run until the loop ends; but a yield per 128
/// messages, tokio's budget, let the driver take at most 128 messages per batch — 9 KB
/// writes for 64-byte messages, and every hop of the transfer woken four times as often as
/// with 64 KiB writes (`message_profile peg 64`: 2 198 sends and 4 756 context switches per
/// 32 MiB, against 1 053 and 2 902 spending per 512 bytes). So the budget is spent by the
/// byte: a task yields once per 64 KiB of small messages, and per 128 as before from 512
/// bytes up.
fn spend_budget(counter: &AtomicUsize, len: usize) -> bool {
    const UNIT: usize = 512;
    let total = counter.load(Ordering::Relaxed) + len.max(1);
    // Only the application's calls touch the counter; a race between two of its threads
    // only shifts when one of them yields.
    if total >= UNIT {
        counter.store(0, Ordering::Relaxed);
        true
    } else {
        counter.store(total, Ordering::Relaxed);
        false
    }
}

/// The `now` to queue a message with: the session reads it only for a
/// message with a lifetime, and the clock read per message shows in
/// message-rate profiles, so it is taken only then.
fn queue_time(props: &MessageProps) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    match props.lifetime {
        Some(_) => Instant::now(),
        None => *EPOCH.get_or_init(Instant::now),
    }
}

/// Closes the connection gracefully when the last handle goes away.
pub(crate) struct Handle(pub(crate) Arc<Shared>);

impl Drop for Handle {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.conn.session_mut().close(0, b"");
        self.0.dispatch(&mut st);
        drop(st);
        self.0.wake_driver();
    }
}

/// Counters of a connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionStats {
    pub session: SessionStats,
    /// Message statuses dropped because the application did not take them
    /// (see `ConnectionConfig::status_queue`).
    pub statuses_lagged: u64,
    /// Over the userspace TCP: the connection core's uTCP counters (segments read, frames
    /// rejected, messages expired, squashed or replaced in the TCP queue, sent as
    /// replacements).
    pub utcp: Option<UtcpStats>,
    /// Over kernel TCP: the `TCP_NOTSENT_LOWAT` in force (it follows the delivery rate
    /// with `ConnectionConfig::unsent_drain`).
    pub notsent_lowat: Option<u32>,
    /// Over TLS: the record layer's counters (records, bytes, key updates).
    pub tls: Option<TlsStats>,
    /// Over kernel TCP without TLS: reads of the socket made by the application's receive
    /// calls themselves (a call that finds nothing received reads the socket rather than
    /// wait for the driver to), not by the driver.
    pub reads_by_application: u64,
    /// Bytes of memory the connection's buffers hold now, by capacity: its read buffer and
    /// idle receive chunks, its TLS buffers, the driver's write batch and TLS read buffer
    /// (not the payloads the application holds, nor queued messages). After
    /// `ConnectionConfig::release_idle_after` without traffic the connection gives back what
    /// holds nothing, and this drops to a few KiB. (Over one connection; a multipath session
    /// does not count its paths' buffers.)
    pub buffer_bytes: usize,
    /// Over kernel TCP without TLS: times the driver went back to reading the socket
    /// because the application's receive calls, which had been reading it, stopped (for a
    /// couple of milliseconds, with none of them waiting): frames that need no receive
    /// call, such as flow credit or the peer's close, are read all the same.
    pub reads_taken_back: u64,
}

/// What the TLS handshake settled.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsInfo {
    /// The cipher suite, e.g. `TLS13_AES_128_GCM_SHA256`.
    pub cipher_suite: String,
    /// SHA-256 of the peer's end-entity certificate (DER), if it sent one.
    pub peer_certificate_sha256: Option<[u8; 32]>,
    /// Whether the handshake resumed an earlier session.
    pub resumed: bool,
}

/// A squarepeg connection: messages and streams over one transport
/// connection. Cheap to clone; the connection closes gracefully when the
/// last clone and the last [`Stream`] are dropped.
#[derive(Clone)]
pub struct Connection {
    pub(crate) handle: Arc<Handle>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("local", &self.shared().local)
            .field("remote", &self.shared().remote)
            .finish()
    }
}

impl Connection {
    pub(crate) fn shared(&self) -> &Shared {
        &self.handle.0
    }

    /// The peer's address.
    pub fn remote_address(&self) -> SocketAddr {
        self.shared().remote
    }

    /// This side's address.
    pub fn local_address(&self) -> SocketAddr {
        self.shared().local
    }

    /// Queues a message; waits while the send queue is full. Returns the
    /// message's number (per connection, from 0). The payload is any
    /// `Into<Bytes>`: a `Vec<u8>` or `String` is taken without a copy, and a
    /// shared `Bytes` (one payload sent many times) costs a reference count.
    pub async fn send_message(
        &self,
        payload: impl Into<Bytes>,
        props: MessageProps,
    ) -> Result<MessageNumber, SendError> {
        let payload = payload.into();
        let sh = self.shared();
        if spend_budget(&sh.send_budget, payload.len()) {
            tokio::task::coop::consume_budget().await;
        }
        let mut payload = match sh.stage(payload, &props) {
            Ok(number) => return Ok(number),
            Err(payload) => Some(payload),
        };
        let (result, wake_driver) = sh
            .wait(
                |s| &s.send_space,
                |st| {
                    let p = payload.take()?;
                    let wake = st.driver_needs_wake(&props);
                    match sh.queue_directly(st, p, props.clone()) {
                        Ok(r) => {
                            sh.dispatch(st);
                            Some((r, wake))
                        }
                        Err(p) => {
                            // No room: wait for `SendQueueAvailable`.
                            payload = Some(p);
                            None
                        }
                    }
                },
            )
            .await;
        if wake_driver {
            sh.wake_driver();
        }
        result
    }

    /// Queues a message, or fails with [`SendError::QueueFull`] at once.
    pub fn try_send_message(
        &self,
        payload: impl Into<Bytes>,
        props: MessageProps,
    ) -> Result<MessageNumber, SendError> {
        let sh = self.shared();
        let payload = match sh.stage(payload.into(), &props) {
            Ok(number) => return Ok(number),
            Err(payload) => payload,
        };
        let mut st = sh.lock();
        let wake_driver = st.driver_needs_wake(&props);
        let r = sh
            .queue_directly(&mut st, payload, props)
            .unwrap_or_else(|_| {
                let session = st.conn.session();
                Err(SendError::QueueFull {
                    queued: session.queued_message_bytes(),
                    limit: session.config().message_send_queue,
                })
            });
        sh.dispatch(&mut st);
        drop(st);
        if wake_driver {
            sh.wake_driver();
        }
        r
    }

    /// The next received message. After the connection closes, messages
    /// already received are still returned, then the error.
    pub async fn recv_message(&self) -> Result<Message, ConnectionError> {
        let sh = self.shared();
        // The budget is spent before a message is taken, never after: a call dropped at this
        // await (a `select!` that took another branch) has taken nothing.
        if spend_budget(&sh.recv_budget, 0) {
            tokio::task::coop::consume_budget().await;
        }
        if let Some(m) = sh.pop_received() {
            return Ok(m);
        }
        let mut inline = sh.read_inline();
        let r = loop {
            if let InlineRead::Read(_) = inline
                && let Some(m) = sh.pop_received()
            {
                return Ok(m);
            }
            let notified = sh.messages.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let waiting = {
                let mut st = sh.lock();
                if let Some(taken) = sh.take_received(&mut st) {
                    break Ok(taken);
                }
                if let Some(e) = st.conn.session().error() {
                    break Err(e.clone());
                }
                match inline {
                    // This call waits for the socket's readiness and reads itself, rather than
                    // have the driver woken to read and hand the messages over; the driver
                    // leaves the reading to it meanwhile (a driver waiting for readiness
                    // already learns it at the next read's wake-up). After a read that gave
                    // no whole message the socket may still be readable: the wait is then
                    // no wait (and spends the task's budget, so a peer's stream of other
                    // frames cannot hold the thread).
                    InlineRead::Read(socket) | InlineRead::Empty(socket) => {
                        st.application_reads = true;
                        Some((socket, WaitingReadable::new(sh, &mut st)))
                    }
                    InlineRead::Unavailable => None,
                }
            };
            match waiting {
                Some((socket, waiting)) => {
                    tokio::select! {
                        // An error is the next read's to report.
                        _ = socket.readable() => {}
                        _ = notified => {}
                    }
                    drop(waiting);
                }
                None => notified.await,
            }
            if let Some(m) = sh.pop_received() {
                return Ok(m);
            }
            inline = sh.read_inline();
        };
        let (m, was_blocked) = r?;
        sh.recv_budget.fetch_add(m.payload.len(), Ordering::Relaxed);
        if was_blocked {
            // Room in the receive queue lets the driver read again.
            sh.wake_driver();
        }
        Ok(m)
    }

    /// A received message if one is waiting, or has arrived in the socket (read without
    /// waiting).
    pub fn try_recv_message(&self) -> Result<Option<Message>, ConnectionError> {
        let sh = self.shared();
        // Nothing received yet: what the socket holds is read here, without waiting, as
        // `recv_message` does (an application polling in a loop then finds its messages
        // whoever has the reading, `ConnectionStats::reads_taken_back`).
        for read_first in [false, true] {
            if read_first && !matches!(sh.read_inline(), InlineRead::Read(_)) {
                break;
            }
            let cached = sh.received().pop();
            if let Some(m) = cached {
                return Ok(Some(m));
            }
            let mut st = sh.lock();
            if let Some((m, was_blocked)) = sh.take_received(&mut st) {
                drop(st);
                if was_blocked {
                    sh.wake_driver();
                }
                return Ok(Some(m));
            }
        }
        match sh.lock().conn.session().error() {
            Some(e) => Err(e.clone()),
            None => Ok(None),
        }
    }

    /// The next message status: `Sent` when handed to the kernel, `Expired`
    /// or `Squashed` when dropped before, `Discarded` when the connection
    /// closed first. Over the userspace TCP the TCP queue decides (see
    /// `squarepeg_connection`, "Message statuses"): `Sent` when transmitted
    /// (with a lifetime: when acknowledged), `Replaced` when an inconsistent
    /// retransmission carried other messages in its place. Statuses are kept
    /// (up to `ConnectionConfig::status_queue`) until taken here.
    pub async fn next_message_status(
        &self,
    ) -> Result<(MessageNumber, MessageStatus), ConnectionError> {
        self.shared()
            .wait(
                |s| &s.statuses,
                |st| {
                    if let Some(s) = st.statuses.pop() {
                        return Some(Ok(s));
                    }
                    st.conn.session().error().map(|e| Err(e.clone()))
                },
            )
            .await
    }

    /// A message status if one is waiting.
    pub fn try_next_message_status(&self) -> Option<(MessageNumber, MessageStatus)> {
        self.shared().lock().statuses.pop()
    }

    /// Opens a stream; waits while the peer's stream limit is reached.
    pub async fn open_stream(&self) -> Result<Stream, StreamError> {
        let id = self
            .shared()
            .wait(
                |s| &s.streams_available,
                |st| match st.conn.session_mut().open_stream() {
                    Err(StreamError::StreamsBlocked) => None,
                    other => Some(other),
                },
            )
            .await?;
        Ok(Stream::new(self.clone(), id))
    }

    /// The next stream the peer opened.
    pub async fn accept_stream(&self) -> Result<Stream, ConnectionError> {
        let id = self
            .shared()
            .wait(
                |s| &s.incoming,
                |st| {
                    if let Some(id) = st.conn.session_mut().accept_stream() {
                        return Some(Ok(id));
                    }
                    st.conn.session().error().map(|e| Err(e.clone()))
                },
            )
            .await?;
        Ok(Stream::new(self.clone(), id))
    }

    /// Graceful close: sends everything queued, then APPLICATION_CLOSE
    /// (code 0), and waits until the peer has closed too (or the drain
    /// timeout passed) and the socket is closed. Blocks as long as queued
    /// stream data waits for the peer's flow-control credit; use
    /// [`Connection::abort`] after a timeout of your choice if needed.
    /// [`Connection::close_reason`] then says how it ended:
    /// [`ConnectionError::LocallyClosed`] for a clean close;
    /// `Transport(TransportError::NothingReceived)` if the peer ended the
    /// connection, or let the drain timeout pass, without ever having sent a
    /// frame (nothing sent reached a squarepeg session).
    pub async fn close(&self) {
        {
            let mut st = self.shared().lock();
            st.conn.session_mut().close(0, b"");
            // Later sends fail (the outbox learns the session is closing).
            self.shared().dispatch(&mut st);
        }
        self.shared().wake_driver();
        self.closed().await;
    }

    /// Aborts: queued data is discarded and the peer gets APPLICATION_CLOSE
    /// with `code` and `reason`.
    pub fn abort(&self, code: u64, reason: &[u8]) {
        let sh = self.shared();
        let mut st = sh.lock();
        st.conn.session_mut().abort(Instant::now(), code, reason);
        sh.dispatch(&mut st);
        drop(st);
        sh.wake_driver();
    }

    /// Waits until the connection is closed and its socket released;
    /// returns why it closed.
    pub async fn closed(&self) -> ConnectionError {
        self.shared()
            .wait(
                |s| &s.finished,
                |st| {
                    if !st.driver_done {
                        return None;
                    }
                    // The driver always leaves an error; a stand-in should it ever not.
                    Some(
                        st.conn
                            .session()
                            .error()
                            .cloned()
                            .unwrap_or(ConnectionError::Transport(TransportError::Io(
                                std::io::ErrorKind::Other,
                            ))),
                    )
                },
            )
            .await
    }

    /// The error that closed the connection, if it is closed.
    pub fn close_reason(&self) -> Option<ConnectionError> {
        self.shared().lock().conn.session().error().cloned()
    }

    /// Counters.
    pub fn stats(&self) -> ConnectionStats {
        let st = self.shared().lock();
        let core = st.conn.stats();
        let mut session = core.session;
        session.messages_discarded += st.staged_discarded;
        ConnectionStats {
            session,
            statuses_lagged: st.statuses_lagged,
            utcp: core.utcp,
            notsent_lowat: st.notsent_lowat,
            tls: core.tls,
            reads_by_application: st.reads_by_application,
            reads_taken_back: st.reads_taken_back,
            buffer_bytes: st.conn.buffer_capacity() + st.driver_buffer_bytes,
        }
    }

    /// Over TLS, once the handshake is done: the cipher suite, the peer's certificate
    /// fingerprint, resumption.
    pub fn tls_info(&self) -> Option<TlsInfo> {
        let st = self.shared().lock();
        let tls = st.conn.tls()?;
        let suite = tls.negotiated_suite()?;
        Some(TlsInfo {
            cipher_suite: format!("{:?}", suite.suite()),
            peer_certificate_sha256: tls
                .peer_certificates()
                .and_then(|c| c.first())
                .map(squarepeg_tls::config::certificate_fingerprint),
            resumed: tls.handshake_kind() == Some(squarepeg_tls::rustls::HandshakeKind::Resumed),
        })
    }

    /// Over TLS: updates this side's sending keys now (RFC 8446 §4.6.3), and asks the peer
    /// to update its own with `request_peer`. Keys are also updated on their own before a
    /// key's confidentiality limit. Returns false on a cleartext connection.
    pub fn update_tls_keys(&self, request_peer: bool) -> bool {
        let sh = self.shared();
        let mut st = sh.lock();
        let Some(tls) = st.conn.tls_mut() else {
            return false;
        };
        tls.initiate_key_update(request_peer);
        drop(st);
        sh.wake_driver();
        true
    }

    /// Waits until the connection is ready for data: at once in cleartext, after the TLS
    /// handshake over TLS ([`Connection::connect`] already waits for it; an accepted
    /// connection may be used at once, its data waits for the handshake). Fails with why the
    /// connection ended if it ended first (e.g. a refused certificate:
    /// `TransportError::Tls(TlsFailure::Certificate)`).
    pub async fn established(&self) -> Result<(), ConnectionError> {
        self.shared()
            .wait(
                |s| &s.established,
                |st| {
                    if st.conn.is_established() {
                        Some(Ok(()))
                    } else {
                        st.conn.session().error().cloned().map(Err)
                    }
                },
            )
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MESSAGE_RECORD_BYTES;
    use squarepeg_connection::{Config, Connection as Core1, Role, Substrate};

    fn shared() -> Shared {
        let core = Core1::new(Role::Client, Config::default(), Substrate::byte_stream()).unwrap();
        let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
        Shared::new(core, 1024, addr, addr)
    }

    /// Messages the outbox accepted before the session closed (the driver saw the peer's
    /// close before it took them) end as `Discarded`, counted, and later sends go to the
    /// session and fail; messages the session took before keep their numbers and statuses.
    #[test]
    fn staged_messages_are_discarded_when_the_session_closed_first() {
        let sh = shared();
        let stage = |n: u8| {
            sh.outbox()
                .stage(vec![n].into(), &MessageProps::default(), Instant::now())
        };
        assert!(matches!(
            stage(0),
            Staging::Staged {
                number: 0,
                wake: true
            }
        ));
        assert!(matches!(
            stage(1),
            Staging::Staged {
                number: 1,
                wake: false
            }
        ));
        // Any lock moves them into the session.
        assert!(sh.lock().conn.session().has_queued_messages());
        assert!(matches!(
            stage(2),
            Staging::Staged {
                number: 2,
                wake: true
            }
        ));
        assert!(matches!(
            stage(3),
            Staging::Staged {
                number: 3,
                wake: false
            }
        ));
        {
            // The session ends without the outbox being drained (as when the driver handles
            // the peer's abort between the application's sends).
            let mut st = sh.state.lock().unwrap();
            st.conn.session_mut().abort(Instant::now(), 1, b"");
        }
        let mut st = sh.lock();
        sh.dispatch(&mut st);
        let mut statuses = Vec::new();
        while let Some(s) = st.statuses.pop() {
            statuses.push(s);
        }
        statuses.sort_by_key(|s| s.0);
        assert_eq!(
            statuses,
            [
                (0, MessageStatus::Discarded),
                (1, MessageStatus::Discarded),
                (2, MessageStatus::Discarded),
                (3, MessageStatus::Discarded),
            ]
        );
        assert_eq!(st.staged_discarded, 2);
        drop(st);
        // The outbox now refuses: the session answers.
        assert!(matches!(stage(4), Staging::Locked(_)));
    }

    /// The outbox takes a message only while the send queue has room by its count (the
    /// session's bytes as last seen plus its own), and leaves dependencies and squash keys
    /// to the session.
    #[test]
    fn outbox_admits_by_the_send_queue_limit() {
        // Room for 100 payload bytes in two messages (each also costs its record).
        let mut ob = Outbox::new(10, 0, 100 + 2 * MESSAGE_RECORD_BYTES, false, true);
        let now = Instant::now();
        let plain = MessageProps::default();
        // An empty queue takes any message, as the session's does.
        assert!(matches!(
            ob.stage(vec![0; 150].into(), &plain, now),
            Staging::Staged { number: 10, .. }
        ));
        assert!(matches!(
            ob.stage(vec![0; 1].into(), &plain, now),
            Staging::Locked(_)
        ));
        let mut taken = VecDeque::new();
        ob.take_all(&mut taken, 0);
        assert_eq!(taken.len(), 1);
        // Still counted (now as the session's) until the driver says it went.
        assert!(matches!(
            ob.stage(vec![0; 1].into(), &plain, now),
            Staging::Locked(_)
        ));
        ob.resync(11, 40);
        assert!(matches!(
            ob.stage(vec![0; 60].into(), &plain, now),
            Staging::Staged { number: 11, .. }
        ));
        assert!(matches!(
            ob.stage(vec![0; 1].into(), &plain, now),
            Staging::Locked(_)
        ));
        ob.resync(99, 0);
        // With messages staged, the number is the outbox's own.
        let dep = MessageProps {
            depends_on: Some(11),
            ..Default::default()
        };
        let squash = MessageProps {
            squash_key: Some(1),
            ..Default::default()
        };
        assert!(matches!(
            ob.stage(vec![0].into(), &dep, now),
            Staging::Locked(_)
        ));
        assert!(matches!(
            ob.stage(vec![0].into(), &squash, now),
            Staging::Locked(_)
        ));
        assert!(matches!(
            ob.stage(vec![0].into(), &plain, now),
            Staging::Staged { number: 12, .. }
        ));
        let too_large = vec![0; squarepeg_session::MAX_MESSAGE_SIZE + 1];
        let mut big = Outbox::new(0, 0, usize::MAX, false, true);
        assert!(matches!(
            big.stage(too_large.into(), &plain, now),
            Staging::Locked(_)
        ));
    }

    /// The run-length queue behaves as a plain queue of statuses with the
    /// same limit: same statuses in the same order, same drops, on runs
    /// broken by gaps, other statuses and the limit.
    #[test]
    fn status_queue_is_a_bounded_fifo() {
        for limit in [1, 2, 3, 7, 100] {
            let mut runs = StatusQueue::new(limit);
            let mut plain = VecDeque::new();
            let mut x: u64 = 12345;
            let mut number = 0;
            for _ in 0..5000 {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                let r = x >> 33;
                if r.is_multiple_of(5) {
                    assert_eq!(runs.pop(), plain.pop_front());
                    continue;
                }
                // Mostly consecutive numbers and `Sent`, sometimes a gap or
                // another status.
                number += if r.is_multiple_of(7) { 3 } else { 1 };
                let status = match r % 11 {
                    0 => MessageStatus::Expired,
                    1 => MessageStatus::Squashed,
                    _ => MessageStatus::Sent,
                };
                if r.is_multiple_of(3) {
                    // A run of statuses at once, at times longer than the queue.
                    let n = r % 13;
                    let mut dropped = 0;
                    for k in number..number + n {
                        if plain.len() >= limit {
                            plain.pop_front();
                            dropped += 1;
                        }
                        plain.push_back((k, status));
                    }
                    assert_eq!(runs.push_run(number..number + n, status), dropped);
                    number += n;
                    assert_eq!(runs.len, plain.len());
                    continue;
                }
                let lagged = plain.len() >= limit;
                if lagged {
                    plain.pop_front();
                }
                plain.push_back((number, status));
                assert_eq!(runs.push(number, status), lagged);
                assert_eq!(runs.len, plain.len());
            }
            while let Some(s) = plain.pop_front() {
                assert_eq!(runs.pop(), Some(s));
            }
            assert_eq!(runs.pop(), None);
        }
    }
}
