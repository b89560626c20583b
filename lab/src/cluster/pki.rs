//! The cluster's identities, made once per state directory with openssl:
//! a CA; the API server's serving certificate (valid for every name a
//! client uses: 127.0.0.1, the node's address, the `kubernetes` Service's
//! address and names, which the agent's in-cluster client checks against
//! the CA in its ServiceAccount token volume); the API server's client
//! certificate towards the kubelet (system:masters); the ServiceAccount
//! signing key; and bearer tokens for the admin and the node (as
//! envtest does: a static token file).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use xtask::util::output;

use super::network::{Network, SERVICE_IP};
use super::State;

pub(super) fn dir(state: &State) -> PathBuf {
    state.path("pki")
}

pub(super) fn ca_cert(state: &State) -> PathBuf {
    dir(state).join("ca.crt")
}

pub(super) fn tokens_file(state: &State) -> PathBuf {
    dir(state).join("tokens.csv")
}

/// Makes what is missing (an existing identity is kept: the running
/// daemons and the issued ServiceAccount tokens depend on it).
pub(super) fn ensure(state: &State, net: &Network) -> anyhow::Result<()> {
    let d = dir(state);
    std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    if !d.join("ca.crt").exists() {
        openssl(
            &d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "3650",
                "-subj",
                "/CN=volume-health-cluster-ca",
            ],
        )?;
    }
    if !d.join("apiserver.crt").exists() {
        let sans = serving_names(state.node_name(), net);
        signed(&d, "apiserver", "/CN=kube-apiserver", &format!(
            "subjectAltName={sans}\nextendedKeyUsage=serverAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        ))?;
    }
    if !d.join("apiserver-kubelet-client.crt").exists() {
        signed(
            &d,
            "apiserver-kubelet-client",
            "/O=system:masters/CN=kube-apiserver-kubelet-client",
            "extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature,keyEncipherment\n",
        )?;
    }
    if !d.join("sa.key").exists() {
        openssl(&d, &["genrsa", "-out", "sa.key", "2048"])?;
        openssl(&d, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"])?;
    }
    if !tokens_file(state).exists() {
        let tokens = Tokens {
            admin: random_token()?,
            node: random_token()?,
        };
        std::fs::write(tokens_file(state), tokens.render(state.node_name()))
            .with_context(|| format!("writing {}", tokens_file(state).display()))?;
    }
    Ok(())
}

/// subjectAltName for the API server's certificate.
pub(super) fn serving_names(node: &str, net: &Network) -> String {
    format!(
        "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,\
         DNS:kubernetes.default.svc.cluster.local,DNS:localhost,DNS:{node},\
         IP:127.0.0.1,IP:{},IP:{SERVICE_IP}",
        net.node_ip
    )
}

/// A key and a certificate `name`.{key,crt} signed by the CA in `d`.
fn signed(d: &Path, name: &str, subject: &str, extensions: &str) -> anyhow::Result<()> {
    let ext = format!("{name}.ext");
    std::fs::write(d.join(&ext), extensions)?;
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    openssl(
        d,
        &[
            "req", "-new", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
            subject,
        ],
    )?;
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "3650",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ],
    )?;
    Ok(())
}

fn openssl(d: &Path, args: &[&str]) -> anyhow::Result<String> {
    output(Command::new("openssl").current_dir(d).args(args))
        .with_context(|| format!("openssl {} (in {})", args.join(" "), d.display()))
}

fn random_token() -> anyhow::Result<String> {
    let mut bytes = [0u8; 16];
    std::io::Read::read_exact(
        &mut std::fs::File::open("/dev/urandom").context("opening /dev/urandom")?,
        &mut bytes,
    )?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The static bearer tokens (the API server's --token-auth-file).
pub(super) struct Tokens {
    pub admin: String,
    pub node: String,
}

impl Tokens {
    fn render(&self, node: &str) -> String {
        format!(
            "{},admin,admin,system:masters\n{},system:node:{node},node-{node},system:nodes\n",
            self.admin, self.node
        )
    }

    pub(super) fn read(state: &State) -> anyhow::Result<Tokens> {
        let path = tokens_file(state);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("{} is not what `up` wrote", path.display()))
    }

    fn parse(text: &str) -> anyhow::Result<Tokens> {
        let token_of = |user: &str| {
            text.lines()
                .map(|l| l.split(',').collect::<Vec<_>>())
                .find(|f| {
                    f.len() >= 3
                        && (f[1] == user || (user == "node" && f[1].starts_with("system:node:")))
                })
                .map(|f| f[0].to_string())
        };
        match (token_of("admin"), token_of("node")) {
            (Some(admin), Some(node)) => Ok(Tokens { admin, node }),
            _ => bail!("no admin or node token"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_through_the_token_file() {
        let tokens = Tokens {
            admin: "a1".into(),
            node: "n1".into(),
        };
        let text = tokens.render("vm");
        assert_eq!(
            text,
            "a1,admin,admin,system:masters\nn1,system:node:vm,node-vm,system:nodes\n"
        );
        let back = Tokens::parse(&text).unwrap();
        assert_eq!((back.admin.as_str(), back.node.as_str()), ("a1", "n1"));
        assert!(Tokens::parse("a1,admin,admin,system:masters\n").is_err());
    }

    #[test]
    fn the_serving_certificate_names_every_address_clients_use() {
        let net = Network {
            node_ip: std::net::Ipv4Addr::new(192, 0, 2, 2),
        };
        let sans = serving_names("vm", &net);
        for name in [
            "IP:127.0.0.1",
            "IP:192.0.2.2",
            "IP:10.96.0.1",
            "DNS:kubernetes.default.svc",
            "DNS:vm",
        ] {
            assert_eq!(sans.split(',').filter(|s| *s == name).count(), 1, "{name}");
        }
    }

    #[test]
    fn tokens_are_32_hex_digits_and_differ() {
        let (a, b) = (random_token().unwrap(), random_token().unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
