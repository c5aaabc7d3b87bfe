//! A container named by its id, a unique prefix, or a name; ambiguity said with the candidates.

use super::*;
use vgpu_ledger::KubeNames;

fn known() -> Vec<Known> {
    vec![
        Known {
            id: "a9c8e34c98691111".into(),
            names: names_of(None, Some(&"web".to_string()), None),
        },
        Known {
            id: "a9c8e34c98692222".into(),
            names: names_of(None, None, Some(&"trainer".to_string())),
        },
        Known {
            id: "b0000000000000000".into(),
            names: names_of(
                Some(&KubeNames {
                    namespace: "ml".into(),
                    pod: "p-0".into(),
                    container: "main".into(),
                }),
                None,
                None,
            ),
        },
        // A container whose id is another's name: the id wins.
        Known {
            id: "web".into(),
            names: vec![],
        },
        Known {
            id: "c0000000000000000".into(),
            names: names_of(None, None, Some(&"main".to_string())),
        },
    ]
}

fn r(reference: &str) -> Result<String, RefError> {
    resolve(reference, &known(), Path::new("/run/vgpu"))
}

#[test]
fn a_full_id_a_unique_prefix_and_each_kind_of_name_name_one_container() {
    assert_eq!(r("a9c8e34c98691111").unwrap(), "a9c8e34c98691111");
    assert_eq!(r("a9c8e34c98691").unwrap(), "a9c8e34c98691111");
    assert_eq!(r("b0").unwrap(), "b0000000000000000");
    assert_eq!(r("trainer").unwrap(), "a9c8e34c98692222", "Podman's name");
    assert_eq!(r("p-0/main").unwrap(), "b0000000000000000", "pod/container");
    assert_eq!(r("ml/p-0/main").unwrap(), "b0000000000000000");
    assert_eq!(r("web").unwrap(), "web", "a full id before a name");
}

#[test]
fn ambiguity_lists_the_candidates_and_none_says_where_it_looked() {
    let e = r("a9c8e34c9869").unwrap_err();
    assert_eq!(
        e.to_string(),
        "a9c8e34c9869 is ambiguous: it is the id prefix of a9c8e34c9869, the id prefix of a9c8e34c9869; give more of the id"
    );
    // A Kubernetes container name and a Podman name alike.
    let e = r("main").unwrap_err();
    assert!(
        matches!(&e, RefError::Ambiguous { matches, .. } if matches.len() == 2),
        "{e}"
    );
    assert!(e.to_string().contains("the name of b00000000000"), "{e}");
    let e = r("zzz").unwrap_err();
    assert_eq!(
        e.to_string(),
        "no container zzz under /run/vgpu: no id, id prefix or name (Kubernetes, Docker or Podman) fits it (the environment-only mode has no state)"
    );
    assert!(
        matches!(r(""), Err(RefError::None { .. })),
        "an empty reference names none"
    );
}

#[test]
fn podmans_names_come_from_its_storage_record_and_its_graphroot_from_storage_conf() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("storage.conf");
    let root = dir.path().join("storage");
    std::fs::write(
        &conf,
        format!(
            "# an operator's comment\n[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\n",
            root.display()
        ),
    )
    .unwrap();
    assert_eq!(podman_graphroot(conf.to_str()), root);
    assert_eq!(
        podman_graphroot(Some("/nonexistent/storage.conf")),
        PathBuf::from("/var/lib/containers/storage")
    );
    std::fs::create_dir_all(root.join("vfs-containers")).unwrap();
    std::fs::write(
        root.join("vfs-containers/containers.json"),
        r#"[{"id":"5b89","names":["trainer","alias"],"image":"x"},{"id":"6c00","names":[]}]"#,
    )
    .unwrap();
    std::fs::create_dir_all(root.join("overlay-containers")).unwrap();
    std::fs::write(root.join("overlay-containers/containers.json"), "not json").unwrap();
    let names = podman_names(&root);
    assert_eq!(names.get("5b89").map(String::as_str), Some("trainer"));
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(podman_names(Path::new("/nonexistent")).is_empty());
}
