//! The DaemonSet's counts and its pods' states, as JSON the API server returns (camelCase fields).

use super::*;
use serde_json::json;

fn ds(generation: i64, status: serde_json::Value) -> DaemonSet {
    serde_json::from_value(json!({
        "metadata": {"name": "vgpu-uninstall-hook", "generation": generation},
        "status": status,
    }))
    .unwrap()
}

fn counts(observed: i64, desired: i32, ready: i32, updated: i32) -> serde_json::Value {
    json!({"observedGeneration": observed, "desiredNumberScheduled": desired, "numberReady": ready,
           "updatedNumberScheduled": updated, "currentNumberScheduled": desired, "numberMisscheduled": 0})
}

#[test]
fn done_only_when_the_controller_saw_the_spec_and_every_node_is_ready() {
    // Just created: the controller has not written a status yet (desired 0 would read as done).
    let fresh: DaemonSet =
        serde_json::from_value(json!({"metadata": {"name": "x", "generation": 1}})).unwrap();
    assert!(!Progress::of(&fresh).done());
    // A status of an older generation is not about this spec.
    assert!(!Progress::of(&ds(2, counts(1, 0, 0, 0))).done());
    assert!(!Progress::of(&ds(1, counts(1, 3, 2, 3))).done());
    let all = Progress::of(&ds(1, counts(1, 3, 3, 3)));
    assert_eq!(
        all,
        Progress {
            desired: 3,
            ready: 3,
            observed: true
        }
    );
    assert!(all.done());
    // Ready pods of an older template do not count.
    assert_eq!(Progress::of(&ds(1, counts(1, 3, 3, 1))).ready, 1);
    assert!(!Progress::of(&ds(1, counts(1, 3, 3, 1))).done());
    // No node to run on: nothing to wait for.
    assert!(Progress::of(&ds(1, counts(1, 0, 0, 0))).done());
}

fn pod(node: Option<&str>, status: serde_json::Value) -> Pod {
    let mut p = json!({"metadata": {"name": "p"}, "spec": {"containers": []}, "status": status});
    if let Some(n) = node {
        p["spec"]["nodeName"] = json!(n);
    }
    serde_json::from_value(p).unwrap()
}

fn ready(ok: bool) -> serde_json::Value {
    json!({"type": "Ready", "status": if ok { "True" } else { "False" }})
}

#[test]
fn each_pod_not_ready_is_named_by_node_with_its_reason() {
    let pods = vec![
        pod(
            Some("gpu-b"),
            json!({"phase": "Running", "conditions": [ready(true)]}),
        ),
        // The uninstall failed there and is retried.
        pod(
            Some("gpu-c"),
            json!({"phase": "Pending", "conditions": [ready(false)],
            "initContainerStatuses": [{"name": "uninstall", "ready": false, "restartCount": 2, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}),
        ),
        // The image is still being pulled there.
        pod(
            Some("gpu-a"),
            json!({"phase": "Pending",
            "initContainerStatuses": [{"name": "uninstall", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "PodInitializing"}}}]}),
        ),
        // No node takes it.
        pod(
            None,
            json!({"phase": "Pending", "conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}),
        ),
        // Init done (exit 0), the idle container not started yet.
        pod(
            Some("gpu-d"),
            json!({"phase": "Pending", "conditions": [ready(false)],
            "initContainerStatuses": [{"name": "uninstall", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}}],
            "containerStatuses": [{"name": "done", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"waiting": {"reason": "ContainerCreating"}}}]}),
        ),
        // The init container exited with an error and is not restarted yet.
        pod(
            Some("gpu-e"),
            json!({"phase": "Pending",
            "initContainerStatuses": [{"name": "uninstall", "ready": false, "restartCount": 0, "image": "i", "imageID": "",
                "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}]}),
        ),
        pod(Some("gpu-f"), json!({})),
    ];
    assert_eq!(
        not_ready(&pods),
        [
            "gpu-a: init container uninstall: PodInitializing",
            "gpu-c: init container uninstall: CrashLoopBackOff, last exit status 1",
            "gpu-d: container done: ContainerCreating",
            "gpu-e: init container uninstall: Error, exit status 2",
            "gpu-f: Pending",
            "unscheduled: Pending, PodScheduled: Unschedulable",
        ]
    );
}
