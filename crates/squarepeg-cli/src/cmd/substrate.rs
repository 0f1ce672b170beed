//! `--substrate kernel|utcp` for `peg listen` and `peg connect`: the operating system's TCP,
//! or squarepeg's own TCP on a TUN device (set up as `peg tcp` does it), under the same
//! connection and the same commands.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, ensure};
use clap::{Args, ValueEnum};

use super::stack::{RunningStack, StackArgs, check_target};

/// The TCP under the connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum Substrate {
    /// The operating system's TCP: in-order delivery; priorities, lifetimes and squash act on
    /// what the kernel has not taken yet.
    #[default]
    Kernel,
    /// squarepeg's userspace TCP on a TUN device: messages delivered as soon as they arrive,
    /// out of order; priorities, lifetimes and squash in the TCP's own send queue (needs a
    /// TUN device: --setup as root, or one made by `peg tcp setup`).
    Utcp,
}

/// The substrate and, for `utcp`, its device and stack.
#[derive(Args, Debug)]
pub struct SubstrateArgs {
    /// The TCP to run over.
    #[arg(long, value_enum, default_value_t = Substrate::Kernel)]
    pub substrate: Substrate,
    #[command(flatten, next_help_heading = "Userspace TCP (--substrate utcp)")]
    pub stack: StackArgs,
}

impl SubstrateArgs {
    /// Fails when device options (`given`: the stack options on the command line, see
    /// [`StackArgs::given_in`]) come without `--substrate utcp`: they would be ignored.
    pub fn check(&self, given: &[String]) -> anyhow::Result<()> {
        ensure!(
            self.substrate == Substrate::Utcp || given.is_empty(),
            "{} appl{} to the userspace TCP's device: add --substrate utcp",
            given.join(", "),
            if given.len() == 1 { "ies" } else { "y" }
        );
        Ok(())
    }

    /// For `utcp`: checks the address to listen on and starts the stack; `queue_delay`: the
    /// command's default `--queue-delay-limit`.
    pub fn start_listening(
        &self,
        addr: &str,
        queue_delay: Option<Duration>,
    ) -> anyhow::Result<(SocketAddr, RunningStack)> {
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("bad address {addr:?}: give IP:PORT"))?;
        self.stack.listen_addrs(addr)?;
        Ok((addr, self.start(queue_delay)?))
    }

    /// For `utcp`: checks the address to connect to and starts the stack (`queue_delay` as
    /// for [`start_listening`](Self::start_listening)).
    pub fn start_connecting(
        &self,
        addr: &str,
        queue_delay: Option<Duration>,
    ) -> anyhow::Result<(SocketAddr, RunningStack)> {
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("bad address {addr:?}: give IP:PORT"))?;
        check_target(&self.stack, addr)?;
        Ok((addr, self.start(queue_delay)?))
    }

    fn start(&self, queue_delay: Option<Duration>) -> anyhow::Result<RunningStack> {
        let limit = self.stack.queue_delay_limit(queue_delay);
        self.stack
            .start_with(|c| c.connection.queue_delay_limit = limit)
    }
}
