//! Emulated hosts for the tests that need several: network namespaces `<prefix><h>` on one
//! bridge in `<prefix>sw`, each with an `eth0` at `<subnet><h + 1>/24` (and any further
//! addresses asked for), loopback up. Removed on drop, and before building in case an earlier
//! run was killed. Needs root and iproute2.

use std::process::{Command, Stdio};

/// `ip ARGS`, quietly; whether it succeeded.
pub fn ip(args: &[&str]) -> bool {
    Command::new("ip")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The hosts, while this value lives.
pub struct Hosts {
    prefix: String,
    count: usize,
}

impl Hosts {
    /// `count` hosts named from `prefix`, host h at `<subnet><h + 1>` plus the addresses
    /// (cidr) `extra(h)` gives; or why they cannot be built here.
    pub fn build(
        prefix: &str,
        subnet: &str,
        count: usize,
        extra: impl Fn(usize) -> Vec<String>,
    ) -> Result<Self, String> {
        // SAFETY: a plain query.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root for network namespaces".into());
        }
        if !ip(&["-V"]) {
            return Err("needs ip (iproute2)".into());
        }
        let hosts = Hosts {
            prefix: prefix.to_string(),
            count,
        };
        hosts.teardown();
        let sw = format!("{prefix}sw");
        let ok = ip(&["netns", "add", &sw])
            && ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"])
            && ip(&["-n", &sw, "link", "set", "br0", "up"])
            && (0..count).all(|h| {
                let (ns, a, b) = (
                    format!("{prefix}{h}"),
                    format!("{prefix}e{h}"),
                    format!("{prefix}p{h}"),
                );
                let addrs = std::iter::once(format!("{subnet}{}/24", h + 1)).chain(extra(h));
                ip(&["netns", "add", &ns])
                    && ip(&["link", "add", &a, "type", "veth", "peer", "name", &b])
                    && ip(&["link", "set", &a, "netns", &ns])
                    && ip(&["link", "set", &b, "netns", &sw])
                    && ip(&["-n", &ns, "link", "set", &a, "name", "eth0"])
                    && addrs
                        .into_iter()
                        .all(|addr| ip(&["-n", &ns, "addr", "add", &addr, "dev", "eth0"]))
                    && ip(&["-n", &ns, "link", "set", "eth0", "up"])
                    && ip(&["-n", &ns, "link", "set", "lo", "up"])
                    && ip(&["-n", &sw, "link", "set", &b, "master", "br0", "up"])
            });
        if !ok {
            return Err("building the namespaces failed".into());
        }
        Ok(hosts)
    }

    /// Shapes host `h`'s sending link (`eth0` in its namespace) with `tc tbf` at `rate`, with
    /// `burst` and `latency` as tc writes them; whether tc took it.
    pub fn shape(&self, h: usize, rate: &str, burst: &str, latency: &str) -> bool {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &format!("{}{h}", self.prefix),
                "tc",
                "qdisc",
            ])
            .args(["replace", "dev", "eth0", "root", "tbf", "rate", rate])
            .args(["burst", burst, "latency", latency])
            .status()
            .is_ok_and(|s| s.success())
    }

    /// The bridge namespace, where host h's port is `<prefix>p<h>`.
    pub fn switch(&self) -> String {
        format!("{}sw", self.prefix)
    }

    fn teardown(&self) {
        for h in 0..self.count {
            ip(&["netns", "del", &format!("{}{h}", self.prefix)]);
        }
        ip(&["netns", "del", &self.switch()]);
    }
}

impl Drop for Hosts {
    fn drop(&mut self) {
        self.teardown();
    }
}
