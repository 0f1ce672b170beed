//! A whole lab: topology plus emulator, removed together.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::NetError;
use super::emulator::{
    CaptureSide, DEFAULT_MAX_IN_FLIGHT, Emulator, EmulatorConfig, EmulatorStats,
};
use super::netns::NetNs;
use super::topology::{self, Addresses, CleanupReport, Topology, TopologyInfo};
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

/// A running lab: three namespaces, two veth pairs and the emulator thread between them.
/// Dropping it (also while unwinding from a panic) stops the emulator and removes the
/// namespaces; [`Lab::teardown`] does the same and reports errors and final counters.
#[derive(Debug)]
pub struct Lab {
    config: LabConfig,
    // Field order matters for Drop: the emulator stops before the namespaces go.
    emulator: Option<Emulator>,
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
        let topology = Topology::create(&config.name)?;
        let info = topology.info();
        let mut emulator_config = EmulatorConfig::new(
            &info.interfaces.emulator_client,
            &info.interfaces.emulator_server,
        );
        emulator_config.bottleneck = config.bottleneck();
        emulator_config.seed = config.seed;
        emulator_config.client_side = config.client_side.clone();
        emulator_config.server_side = config.server_side.clone();
        emulator_config.max_in_flight = config.max_in_flight;
        if let Some(dir) = &config.capture_dir {
            std::fs::create_dir_all(dir).map_err(|source| NetError::Io {
                context: format!("creating capture directory {}", dir.display()),
                source,
            })?;
            for side in [CaptureSide::Client, CaptureSide::Server] {
                emulator_config
                    .captures
                    .push((side, capture_path(dir, side)));
            }
        }
        let emulator = Emulator::spawn(topology.emulator(), emulator_config)?;
        Ok(Self {
            config,
            emulator: Some(emulator),
            topology,
            cleaned,
        })
    }

    /// The configuration it was started with.
    pub fn config(&self) -> &LabConfig {
        &self.config
    }

    /// Names, interfaces and addresses.
    pub fn info(&self) -> &TopologyInfo {
        self.topology.info()
    }

    /// The addresses of client and server.
    pub fn addresses(&self) -> &Addresses {
        self.topology.addresses()
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

    /// Flushes running captures to their files.
    pub fn flush_captures(&self) -> Result<(), NetError> {
        self.emulator()?.flush_captures()
    }

    /// Changes one direction's link from now on.
    pub fn reconfigure(&self, dir: Direction, link: LinkConfig) -> Result<(), NetError> {
        self.emulator()?.reconfigure(dir, link)
    }

    /// Stops the emulator, closes the captures, removes the namespaces and veths, and
    /// returns the emulator's final counters.
    pub fn teardown(mut self) -> Result<EmulatorStats, NetError> {
        let stats = match self.emulator.take() {
            Some(emulator) => emulator.stop(),
            None => Err(NetError::EmulatorStopped("already stopped".to_owned())),
        };
        // Remove the namespaces even if the emulator failed.
        let Self { topology, .. } = self;
        topology.teardown()?;
        stats
    }
}
