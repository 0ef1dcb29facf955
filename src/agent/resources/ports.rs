//! Host ports for service ports, from `[container] port-range`, with a reuse cooldown.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// Not enough free host ports: `(requested, free)`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("not enough free host ports: requested {0}, free {1}")]
pub struct PortsExhausted(pub usize, pub usize);

/// The agent's host port range. Released ports rest for `cooldown` before reuse so that a
/// client still talking to a destroyed kernel never reaches a new one on the same port.
#[derive(Debug)]
pub struct PortPool {
    free: BTreeSet<u16>,
    cooling: VecDeque<(u16, Instant)>,
    cooldown: Duration,
}

impl PortPool {
    /// All ports of `lo..=hi` free.
    pub fn new(lo: u16, hi: u16, cooldown: Duration) -> PortPool {
        PortPool {
            free: (lo..=hi).collect(),
            cooling: VecDeque::new(),
            cooldown,
        }
    }

    fn thaw(&mut self) {
        let now = Instant::now();
        while let Some(&(port, since)) = self.cooling.front() {
            if now.duration_since(since) < self.cooldown {
                break;
            }
            self.cooling.pop_front();
            self.free.insert(port);
        }
    }

    /// Ports free now (cooling ones excluded).
    pub fn available(&mut self) -> usize {
        self.thaw();
        self.free.len()
    }

    /// Takes `n` ports, lowest first.
    ///
    /// Errors: [`PortsExhausted`]; nothing is taken then.
    pub fn allocate(&mut self, n: usize) -> Result<Vec<u16>, PortsExhausted> {
        self.thaw();
        if n > self.free.len() {
            return Err(PortsExhausted(n, self.free.len()));
        }
        Ok((0..n).filter_map(|_| self.free.pop_first()).collect())
    }

    /// Takes `port` when it is free now; `false` when it is held, cooling, or outside the range.
    pub fn take(&mut self, port: u16) -> bool {
        self.thaw();
        self.free.remove(&port)
    }

    /// Holds ports a kernel had before a restart (recovery); ports outside the range are
    /// simply not tracked.
    pub fn reserve_exact(&mut self, ports: &[u16]) {
        for p in ports {
            self.free.remove(p);
            self.cooling.retain(|(c, _)| c != p);
        }
    }

    /// Gives ports back; they become free after the cooldown.
    pub fn release(&mut self, ports: &[u16]) {
        let now = Instant::now();
        self.cooling.extend(ports.iter().map(|&p| (p, now)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_releases_and_cools_down() {
        let mut pool = PortPool::new(30000, 30003, Duration::from_millis(50));
        let a = pool.allocate(3).unwrap();
        assert_eq!(a, vec![30000, 30001, 30002]);
        assert_eq!(pool.allocate(2), Err(PortsExhausted(2, 1)));
        pool.release(&a[..2]);
        assert_eq!(
            pool.allocate(1).unwrap(),
            vec![30003],
            "released ports are cooling"
        );
        assert_eq!(pool.available(), 0);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(pool.allocate(2).unwrap(), vec![30000, 30001]);
        pool.reserve_exact(&[30002]);
        assert_eq!(pool.available(), 0);
    }
}
