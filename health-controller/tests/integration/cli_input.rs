//! What `health-controller` says when its input is wrong: a missing CSI
//! socket named once, with the option that named it.

use std::process::Command;

/// A misconfigured controller sidecar: the socket's absence said once, with
/// the option that named it (the cause is not repeated by the error chain).
#[test]
fn a_missing_csi_socket_is_named_once() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("csi.sock");
    let out = Command::new(env!("CARGO_BIN_EXE_health-controller"))
        .args(["--log", "warn", "--csi-address"])
        .arg(&socket)
        .args(["--kubeconfig", "/dev/null"])
        .env("POD_NAMESPACE", "csi")
        .env("NO_COLOR", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let s = socket.display();
    assert_eq!(
        stderr.lines().last().unwrap_or_default(),
        format!("health-controller: CSI socket {s} (--csi-address): cannot connect to CSI socket {s}: No such file or directory (os error 2)")
    );
}
