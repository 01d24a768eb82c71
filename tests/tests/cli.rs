//! shaperctl's commands that need no daemon: `check`, shell completions and the man page, and
//! what it says when no daemon answers.

use std::process::Command;

use shaper_tests::bin;

fn shaperctl(args: &[&str]) -> std::process::Output {
    Command::new(bin("shaperctl")).args(args).output().expect("running shaperctl")
}

#[test]
fn check_validates_a_file_without_a_daemon() {
    let root = env!("CARGO_MANIFEST_DIR");
    let good = format!("{root}/../config/roommates.toml");
    let out = shaperctl(&["check", &good]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ok (1 interfaces, 4 classes, 6 rules)"), "{text}");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    let broken = std::fs::read_to_string(&good).unwrap().replace("rate = \"2.9mbit\"", "rate = \"29mbit\"");
    std::fs::write(&bad, broken).unwrap();
    let out = shaperctl(&["check", bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml:") && err.contains("class["), "names the file, line and key: {err}");
}

#[test]
fn completions_and_man_page_come_from_the_command_definitions() {
    let out = shaperctl(&["completions", "bash"]);
    assert!(out.status.success());
    let script = String::from_utf8_lossy(&out.stdout);
    for command in ["set-rate", "set-ceil", "set-prio", "reload", "check", "top", "status"] {
        assert!(script.contains(command), "bash completion lacks {command}");
    }
    let out = shaperctl(&["man"]);
    assert!(out.status.success());
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.starts_with(".ie") || page.contains(".TH shaperctl"), "{page}");
    assert!(page.contains("set\\-ceil"), "{page}");
}

#[test]
fn no_daemon_is_a_clear_error_with_its_own_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("none.sock");
    let out = shaperctl(&["--socket", socket.to_str().unwrap(), "status"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is shaperd running?") && err.contains("none.sock"), "{err}");
}
