//! A whole lab: topology plus emulator, removed together.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::NetError;
use super::emulator::{
    CaptureSide, DEFAULT_MAX_IN_FLIGHT, Emulator, EmulatorConfig, EmulatorStats,
};
use super::netns::NetNs;
use super::topology::{self, Addresses, CleanupReport, PathInfo, Topology, TopologyInfo};
use crate::Direction;
use crate::middlebox::MiddleboxConfig;
use crate::model::{Bottleneck, LinkConfig};

/// What a lab is: its name, the impairments of each direction and the middleboxes (serde, so
/// that `peg lab up` can hand it to its daemon).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabConfig {
    /// The lab's name (1 to 32 of `a-z A-Z 0-9 _ -`), part of its namespace names.
    pub name: String,
    /// Client to server (the simulator's left to right).
    pub up: LinkConfig,
    /// Server to client.
    pub down: LinkConfig,
    /// Seed of the link model and the middleboxes' random choices.
    #[serde(default)]
    pub seed: u64,
    /// Middleboxes between the client and the bottleneck, in path order.
    #[serde(default)]
    pub client_side: Vec<MiddleboxConfig>,
    /// Middleboxes between the bottleneck and the server, in path order.
    #[serde(default)]
    pub server_side: Vec<MiddleboxConfig>,
    /// If set, `client.pcap` (client-facing veth) and `server.pcap` (server-facing veth) are
    /// captured here for the lab's whole life.
    #[serde(default)]
    pub capture_dir: Option<PathBuf>,
    /// Most packets the emulator holds at once.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Paths beyond the first (path 1 first): each its own veth pairs, subnets and emulator.
    /// The fields above describe path 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub extra_paths: Vec<PathConfig>,
}

/// One extra path of a lab (path 0 is described by [`LabConfig`]'s own fields): its links,
/// seed and middleboxes, as independent of the other paths as two access networks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathConfig {
    /// Client to server.
    pub up: LinkConfig,
    /// Server to client.
    pub down: LinkConfig,
    /// Seed of this path's link model and middleboxes.
    #[serde(default)]
    pub seed: u64,
    /// Middleboxes between the client and the bottleneck.
    #[serde(default)]
    pub client_side: Vec<MiddleboxConfig>,
    /// Middleboxes between the bottleneck and the server.
    #[serde(default)]
    pub server_side: Vec<MiddleboxConfig>,
}

impl PathConfig {
    /// A path with both directions from a bottleneck (left = client).
    pub fn new(bottleneck: Bottleneck) -> Self {
        Self {
            up: bottleneck.left_to_right,
            down: bottleneck.right_to_left,
            ..Self::default()
        }
    }

    /// Sets the client-to-server link.
    pub fn with_up(mut self, link: LinkConfig) -> Self {
        self.up = link;
        self
    }

    /// Sets the server-to-client link.
    pub fn with_down(mut self, link: LinkConfig) -> Self {
        self.down = link;
        self
    }

    /// Sets the seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets the client-side middleboxes.
    pub fn with_client_side(mut self, boxes: Vec<MiddleboxConfig>) -> Self {
        self.client_side = boxes;
        self
    }

    /// Sets the server-side middleboxes.
    pub fn with_server_side(mut self, boxes: Vec<MiddleboxConfig>) -> Self {
        self.server_side = boxes;
        self
    }

    /// The bottleneck (left = client).
    pub fn bottleneck(&self) -> Bottleneck {
        Bottleneck {
            left_to_right: self.up.clone(),
            right_to_left: self.down.clone(),
        }
    }
}

/// What a path does, set with [`PathHandle`]'s verbs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PathState {
    /// Carries traffic through its impairments.
    #[default]
    Normal,
    /// Interfaces up, everything dropped silently both ways.
    Blackhole,
    /// Carries nothing, and the client's interface of the path is down.
    Cut,
}

fn default_max_in_flight() -> usize {
    DEFAULT_MAX_IN_FLIGHT
}

impl LabConfig {
    /// An ideal lab called `name`.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            up: LinkConfig::default(),
            down: LinkConfig::default(),
            seed: 0,
            client_side: Vec::new(),
            server_side: Vec::new(),
            capture_dir: None,
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            extra_paths: Vec::new(),
        }
    }

    /// Adds a path (the second, third, …: path 0 is this config's own links).
    pub fn with_path(mut self, path: PathConfig) -> Self {
        self.extra_paths.push(path);
        self
    }

    /// How many paths: 1 plus the extra ones.
    pub fn path_count(&self) -> usize {
        1 + self.extra_paths.len()
    }

    /// Path `index`'s configuration (path 0 from this config's own fields).
    pub fn path(&self, index: usize) -> Option<PathConfig> {
        if index == 0 {
            Some(PathConfig {
                up: self.up.clone(),
                down: self.down.clone(),
                seed: self.seed,
                client_side: self.client_side.clone(),
                server_side: self.server_side.clone(),
            })
        } else {
            self.extra_paths.get(index - 1).cloned()
        }
    }

    /// Sets the client-to-server link.
    pub fn with_up(mut self, link: LinkConfig) -> Self {
        self.up = link;
        self
    }

    /// Sets the server-to-client link.
    pub fn with_down(mut self, link: LinkConfig) -> Self {
        self.down = link;
        self
    }

    /// Sets both directions from a bottleneck (left = client).
    pub fn with_bottleneck(mut self, bottleneck: Bottleneck) -> Self {
        self.up = bottleneck.left_to_right;
        self.down = bottleneck.right_to_left;
        self
    }

    /// Sets the seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Sets the client-side middleboxes.
    pub fn with_client_side(mut self, boxes: Vec<MiddleboxConfig>) -> Self {
        self.client_side = boxes;
        self
    }

    /// Sets the server-side middleboxes.
    pub fn with_server_side(mut self, boxes: Vec<MiddleboxConfig>) -> Self {
        self.server_side = boxes;
        self
    }

    /// Captures both sides into `dir` (created if missing).
    pub fn with_capture_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.capture_dir = Some(dir.into());
        self
    }

    /// The bottleneck (left = client).
    pub fn bottleneck(&self) -> Bottleneck {
        Bottleneck {
            left_to_right: self.up.clone(),
            right_to_left: self.down.clone(),
        }
    }

    /// Checks the name and both links.
    pub fn validate(&self) -> Result<(), NetError> {
        topology::validate_name(&self.name)?;
        self.bottleneck().validate()?;
        if self.path_count() > topology::MAX_PATHS {
            return Err(NetError::Paths(self.path_count()));
        }
        for path in &self.extra_paths {
            path.bottleneck().validate()?;
        }
        Ok(())
    }
}

/// The capture file of one side in a capture directory.
pub fn capture_path(dir: &Path, side: CaptureSide) -> PathBuf {
    dir.join(match side {
        CaptureSide::Client => "client.pcap",
        CaptureSide::Server => "server.pcap",
    })
}

/// The capture file of one side of path `index`: path 0's are [`capture_path`]'s, path
/// `i`'s `path<i>-client.pcap` and `path<i>-server.pcap`.
pub fn path_capture_path(dir: &Path, index: usize, side: CaptureSide) -> PathBuf {
    if index == 0 {
        return capture_path(dir, side);
    }
    dir.join(match side {
        CaptureSide::Client => format!("path{index}-client.pcap"),
        CaptureSide::Server => format!("path{index}-server.pcap"),
    })
}

/// A running lab: three namespaces, two veth pairs and the emulator thread between them.
/// Dropping it (also while unwinding from a panic) stops the emulator and removes the
/// namespaces; [`Lab::teardown`] does the same and reports errors and final counters.
#[derive(Debug)]
pub struct Lab {
    config: LabConfig,
    // Field order matters for Drop: the emulators stop before the namespaces go.
    emulator: Option<Emulator>,
    /// The emulators of paths 1, 2, …
    extra_emulators: Vec<Emulator>,
    /// Each path's state, path 0 first.
    states: Mutex<Vec<PathState>>,
    topology: Topology,
    cleaned: CleanupReport,
}

impl Lab {
    /// Builds the lab: removes leftovers of dead owners first ([`topology::cleanup_leftovers`]),
    /// then creates the namespaces and starts the emulator.
    pub fn start(config: LabConfig) -> Result<Self, NetError> {
        config.validate()?;
        if !super::sys::is_root() {
            return Err(NetError::NotRoot);
        }
        let cleaned = topology::cleanup_leftovers();
        let topology = Topology::create_paths(&config.name, config.path_count())?;
        if let Some(dir) = &config.capture_dir {
            std::fs::create_dir_all(dir).map_err(|source| NetError::Io {
                context: format!("creating capture directory {}", dir.display()),
                source,
            })?;
        }
        let info = topology.info();
        let mut emulators = Vec::new();
        for (index, path) in info.path_list().iter().enumerate() {
            let path_config = config.path(index).ok_or(NetError::NoPath(index))?;
            let mut emulator_config = EmulatorConfig::new(
                &path.interfaces.emulator_client,
                &path.interfaces.emulator_server,
            );
            emulator_config.bottleneck = path_config.bottleneck();
            emulator_config.seed = path_config.seed;
            emulator_config.client_side = path_config.client_side;
            emulator_config.server_side = path_config.server_side;
            emulator_config.max_in_flight = config.max_in_flight;
            if let Some(dir) = &config.capture_dir {
                for side in [CaptureSide::Client, CaptureSide::Server] {
                    emulator_config
                        .captures
                        .push((side, path_capture_path(dir, index, side)));
                }
            }
            // On error, the emulators so far and the topology drop here, in that order.
            emulators.push(Emulator::spawn(topology.emulator(), emulator_config)?);
        }
        let mut emulators = emulators.into_iter();
        let emulator = emulators.next();
        let states = Mutex::new(vec![PathState::Normal; config.path_count()]);
        Ok(Self {
            config,
            emulator,
            extra_emulators: emulators.collect(),
            states,
            topology,
            cleaned,
        })
    }

    /// How many paths the lab has.
    pub fn path_count(&self) -> usize {
        1 + self.extra_emulators.len()
    }

    /// A handle on path `index` (0 is the first), to cut, blackhole, reset, restore or
    /// reconfigure it and read its counters.
    pub fn path(&self, index: usize) -> Result<PathHandle<'_>, NetError> {
        if index >= self.path_count() {
            return Err(NetError::NoPath(index));
        }
        Ok(PathHandle { lab: self, index })
    }

    /// Sets path `index` to `state` (see [`PathHandle::cut`], [`PathHandle::blackhole`],
    /// [`PathHandle::restore`]).
    pub fn set_path_state(&self, index: usize, state: PathState) -> Result<(), NetError> {
        let path = self.path(index)?;
        let emulator = path.emulator()?;
        let mut states = self
            .states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let old = states[index];
        if old == state {
            return Ok(());
        }
        match state {
            PathState::Normal => {
                if old == PathState::Cut {
                    self.topology.set_client_link(index, true)?;
                }
                emulator.set_blocked(false)?;
            }
            PathState::Blackhole => {
                emulator.set_blocked(true)?;
                if old == PathState::Cut {
                    self.topology.set_client_link(index, true)?;
                }
            }
            PathState::Cut => {
                emulator.set_blocked(true)?;
                self.topology.set_client_link(index, false)?;
            }
        }
        states[index] = state;
        Ok(())
    }

    /// Path `index`'s state.
    pub fn path_state(&self, index: usize) -> Result<PathState, NetError> {
        self.path(index)?;
        let states = self
            .states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(states[index])
    }

    /// The emulator of path `index`.
    pub fn path_emulator(&self, index: usize) -> Result<&Emulator, NetError> {
        if index == 0 {
            return self.emulator();
        }
        self.extra_emulators
            .get(index - 1)
            .ok_or(NetError::NoPath(index))
    }

    /// The counters of every path, path 0 first.
    pub fn path_stats(&self) -> Result<Vec<EmulatorStats>, NetError> {
        (0..self.path_count())
            .map(|index| self.path_emulator(index)?.stats())
            .collect()
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &LabConfig {
        &self.config
    }

    /// Names, interfaces and addresses.
    pub fn info(&self) -> &TopologyInfo {
        self.topology.info()
    }

    /// The addresses of client and server (on path 0).
    pub fn addresses(&self) -> &Addresses {
        self.topology.addresses()
    }

    /// The addresses of client and server on path `index`.
    pub fn path_addresses(&self, index: usize) -> Result<Addresses, NetError> {
        Ok(self.path_info(index)?.addresses)
    }

    /// Interfaces and addresses of path `index`.
    pub fn path_info(&self, index: usize) -> Result<PathInfo, NetError> {
        self.info().path(index).ok_or(NetError::NoPath(index))
    }

    /// The client's namespace (run code there with [`NetNs::run`], commands with
    /// [`NetNs::command`]).
    pub fn client(&self) -> &NetNs {
        self.topology.client()
    }

    /// The server's namespace.
    pub fn server(&self) -> &NetNs {
        self.topology.server()
    }

    /// The emulator.
    pub fn emulator(&self) -> Result<&Emulator, NetError> {
        self.emulator
            .as_ref()
            .ok_or_else(|| NetError::EmulatorStopped("already stopped".to_owned()))
    }

    /// Leftovers of dead owners that starting this lab removed.
    pub fn cleaned_leftovers(&self) -> &CleanupReport {
        &self.cleaned
    }

    /// The emulator's counters so far.
    pub fn stats(&self) -> Result<EmulatorStats, NetError> {
        self.emulator()?.stats()
    }

    /// Flushes running captures (of every path) to their files.
    pub fn flush_captures(&self) -> Result<(), NetError> {
        self.emulator()?.flush_captures()?;
        for emulator in &self.extra_emulators {
            emulator.flush_captures()?;
        }
        Ok(())
    }

    /// Changes one direction's link from now on.
    pub fn reconfigure(&self, dir: Direction, link: LinkConfig) -> Result<(), NetError> {
        self.emulator()?.reconfigure(dir, link)
    }

    /// Stops the emulator, closes the captures, removes the namespaces and veths, and
    /// returns the emulator's final counters.
    pub fn teardown(self) -> Result<EmulatorStats, NetError> {
        self.teardown_paths()
            .map(|all| all.into_iter().next().unwrap_or_default())
    }

    /// As [`Lab::teardown`], returning every path's final counters, path 0 first.
    pub fn teardown_paths(mut self) -> Result<Vec<EmulatorStats>, NetError> {
        let mut extra = Vec::new();
        let mut first_error = None;
        for emulator in std::mem::take(&mut self.extra_emulators) {
            match emulator.stop() {
                Ok(stats) => extra.push(stats),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        let stats = match self.emulator.take() {
            Some(emulator) => emulator.stop(),
            None => Err(NetError::EmulatorStopped("already stopped".to_owned())),
        };
        // Remove the namespaces even if the emulator failed.
        let Self { topology, .. } = self;
        topology.teardown()?;
        let mut all = vec![stats?];
        if let Some(error) = first_error {
            return Err(error);
        }
        all.extend(extra);
        Ok(all)
    }
}

/// One path of a running lab ([`Lab::path`]): its control verbs and counters.
#[derive(Debug, Clone, Copy)]
pub struct PathHandle<'a> {
    lab: &'a Lab,
    index: usize,
}

impl PathHandle<'_> {
    /// Which path.
    pub fn index(&self) -> usize {
        self.index
    }

    /// This path's emulator.
    pub fn emulator(&self) -> Result<&Emulator, NetError> {
        self.lab.path_emulator(self.index)
    }

    /// Its interfaces and addresses.
    pub fn info(&self) -> Result<PathInfo, NetError> {
        self.lab.path_info(self.index)
    }

    /// The client's and the server's addresses on this path.
    pub fn addresses(&self) -> Result<Addresses, NetError> {
        self.lab.path_addresses(self.index)
    }

    /// Its state.
    pub fn state(&self) -> Result<PathState, NetError> {
        self.lab.path_state(self.index)
    }

    /// Cuts the path, as walking out of a Wi-Fi network: it carries nothing either way and
    /// the client's interface of the path goes down (the kernel drops its routes; in a lab
    /// of several paths, sockets bound to its address get `EHOSTUNREACH` whatever they talk
    /// to). [`restore`](Self::restore) brings it back.
    pub fn cut(&self) -> Result<(), NetError> {
        self.lab.set_path_state(self.index, PathState::Cut)
    }

    /// Blackholes the path: interfaces stay up, everything is dropped silently both ways.
    pub fn blackhole(&self) -> Result<(), NetError> {
        self.lab.set_path_state(self.index, PathState::Blackhole)
    }

    /// Back to normal (interface up again after a cut, nothing dropped beyond the links'
    /// own impairments).
    pub fn restore(&self) -> Result<(), NetError> {
        self.lab.set_path_state(self.index, PathState::Normal)
    }

    /// Resets every TCP flow the path has carried: both ends get a RST they accept
    /// ([`Emulator::reset_flows`]); the path keeps carrying other and new traffic. Returns
    /// the number of flows reset.
    pub fn reset(&self) -> Result<usize, NetError> {
        self.emulator()?.reset_flows()
    }

    /// Changes one direction's link of this path from now on.
    pub fn reconfigure(&self, dir: Direction, link: LinkConfig) -> Result<(), NetError> {
        self.emulator()?.reconfigure(dir, link)
    }

    /// This path's counters.
    pub fn stats(&self) -> Result<EmulatorStats, NetError> {
        self.emulator()?.stats()
    }
}
