//! The workload: a local PV on the fault disk's mount, its PVC and a pod
//! writing to it, removed again when dropped.

use xtask::util::say;

use super::{Kube, NODE_MOUNT, POD, PVC, TEST_NAMESPACE};

const PV: &str = "volume-health-e2e";

pub(super) struct Workload<'a> {
    kube: &'a Kube,
}

impl<'a> Workload<'a> {
    pub(super) fn create(kube: &'a Kube, node: &str) -> anyhow::Result<Workload<'a>> {
        // Leftovers of an interrupted run would carry old events.
        remove_workload(kube);
        let workload = Workload { kube };
        say("creating the PV, the PVC and the writer pod");
        kube.apply(&workload_yaml(node))?;
        kube.run(&[
            "--namespace",
            TEST_NAMESPACE,
            "wait",
            "--for=condition=Ready",
            &format!("pod/{POD}"),
            "--timeout=180s",
        ])?;
        Ok(workload)
    }
}

impl Drop for Workload<'_> {
    fn drop(&mut self) {
        say("removing the test workload");
        remove_workload(self.kube);
    }
}

/// Deleting the namespace waits for the pod, so kubelet has unmounted the
/// volume before the fault disk goes.
fn remove_workload(kube: &Kube) {
    for args in [
        [
            "delete",
            "namespace",
            TEST_NAMESPACE,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=180s",
        ],
        [
            "delete",
            "persistentvolume",
            PV,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=60s",
        ],
    ] {
        if let Err(e) = kube.run(&args) {
            say(format!("cleanup: {e:#}"));
        }
    }
}

fn workload_yaml(node: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata:
  name: {TEST_NAMESPACE}
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: {PV}
spec:
  capacity:
    storage: 128Mi
  accessModes: ["ReadWriteOnce"]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: ""
  volumeMode: Filesystem
  local:
    path: {NODE_MOUNT}
  nodeAffinity:
    required:
      nodeSelectorTerms:
        - matchExpressions:
            - key: kubernetes.io/hostname
              operator: In
              values: ["{node}"]
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: {PVC}
  namespace: {TEST_NAMESPACE}
spec:
  accessModes: ["ReadWriteOnce"]
  storageClassName: ""
  volumeName: {PV}
  resources:
    requests:
      storage: 128Mi
---
apiVersion: v1
kind: Pod
metadata:
  name: {POD}
  namespace: {TEST_NAMESPACE}
spec:
  nodeName: {node}
  terminationGracePeriodSeconds: 1
  containers:
    - name: writer
      image: busybox:1.36
      command:
        - sh
        - -c
        - while true; do dd if=/dev/zero of=/data/probe bs=4096 count=16 conv=notrunc,fsync 2>&1 | tail -n 1; sleep 2; done
      volumeMounts:
        - name: data
          mountPath: /data
  volumes:
    - name: data
      persistentVolumeClaim:
        claimName: {PVC}
"#
    )
}
