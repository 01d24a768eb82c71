//! What shaperd reads from others, fed random and damaged input: the configuration loader, the
//! control protocol's request decoder, the control socket, and a runtime change's edit of the
//! configuration. Each must answer with a result or an error that says where the input is
//! wrong, never panic, and never take part of a change.
//!
//! The daemon's state (`daemon::State`) holds the loaded datapath, whose maps a change writes,
//! so its `apply` cannot run here without BPF; what can is everything a change goes through
//! before it touches the datapath: the request's decoding, the configuration edit it becomes
//! (`config::edit::set_class_key`) and its validation as a whole file.

use std::{
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
};

use proptest::{prelude::*, sample::select, test_runner::Config as ProptestConfig};
use shaper::{
    api::{ApiError, Handler, Reply, Request, Response, Server, MAX_LINE},
    config::{
        edit::{set_class_key, ClassKey, EditError, NewValue},
        Config, ConfigError,
    },
    daemon::rule_specs,
    rate::Rate,
    rules,
};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};

/// The example configurations (each also loaded by a unit test).
const EXAMPLES: [&str; 2] = [include_str!("../../config/roommates.toml"), include_str!("../../config/office.toml")];
const PATH: &str = "fuzz.toml";

// ---------------------------------------------------------------------------------------------
// Configuration text.

/// Values that the configuration's fields take or nearly take: rates, percentages, durations,
/// names, protocols, ports and ranges, networks, DSCP names, and their near misses.
const VALUES: &[&str] = &[
    "\"10mbit\"",
    "\"1.9mbit\"",
    "\"0.3mbit\"",
    "\"100%\"",
    "\"50%\"",
    "\"0%\"",
    "\"150%\"",
    "\"0bit\"",
    "\"1e9\"",
    "\"18446744073709551616bit\"",
    "\"18446744073709551615tbit\"",
    "\"1.5bit\"",
    "\"-1mbit\"",
    "\"mbit\"",
    "\"1..2mbit\"",
    "\"lan0\"",
    "\"wan0\"",
    "\"guest\"",
    "\"alex\"",
    "\"staff\"",
    "\"\"",
    "\"tcp\"",
    "\"udp\"",
    "\"icmp\"",
    "\"300\"",
    "\"3072-4095\"",
    "\"5-1\"",
    "\"0-65535\"",
    "\"65536\"",
    "\"192.168.1.110\"",
    "\"192.168.1.0/24\"",
    "\"192.168.1.1/24\"",
    "\"::/0\"",
    "\"fd00::1/129\"",
    "\"10.0.0.0/33\"",
    "\"ef\"",
    "\"cs8\"",
    "\"af44\"",
    "\"10ms\"",
    "\"0s\"",
    "\"11s\"",
    "\"1µs\"",
    "\"99999999999999999999h\"",
    "\"upload\"",
    "\"download\"",
    "\"host\"",
    "\"flow\"",
    "\"none\"",
    "0",
    "1",
    "7",
    "8",
    "-1",
    "-64",
    "257",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "1.5",
    "nan",
    "inf",
    "true",
    "false",
    "[]",
    "[1, \"a\"]",
    "{ a = 1 }",
    "1979-05-27T07:32:00Z",
];

/// The keys of each table the configuration has.
const INTERFACE_KEYS: &[&str] = &["name", "rate", "default", "overhead", "replace_qdisc", "direction"];
const CLASS_KEYS: &[&str] = &[
    "name",
    "interface",
    "parent",
    "rate",
    "ceil",
    "prio",
    "weight",
    "horizon",
    "aqm",
    "aqm_target",
    "aqm_interval",
    "isolation",
];
const RULE_KEYS: &[&str] = &["class", "src", "dst", "proto", "sport", "dport", "mark", "dscp"];
const DAEMON_KEYS: &[&str] = &["socket", "tick"];
/// A few that are no key at all.
const NOT_KEYS: &[&str] = &["colour", "\"quoted key\"", "a.b"];

/// Keys of every table, each once, and the ones that are no key at all.
fn keys() -> Vec<&'static str> {
    let mut keys: Vec<&str> = Vec::new();
    for key in [INTERFACE_KEYS, CLASS_KEYS, RULE_KEYS, DAEMON_KEYS, NOT_KEYS].concat() {
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => select(VALUES).prop_map(str::to_owned),
        1 => any::<i64>().prop_map(|v| v.to_string()),
        1 => "[a-z0-9.%-]{0,12}".prop_map(|s| format!("\"{s}\"")),
    ]
}

fn key_line() -> impl Strategy<Value = String> {
    (select(keys()), value()).prop_map(|(k, v)| format!("{k} = {v}"))
}

/// Values that suit `key`, sound and not.
fn values_of(key: &str) -> Vec<&'static str> {
    match key {
        "name" | "default" | "interface" | "parent" | "class" => {
            vec!["\"lan0\"", "\"wan0\"", "\"guest\"", "\"alex\"", "\"staff\"", "\"\"", "\"a b\""]
        }
        "rate" | "ceil" => {
            vec!["\"10mbit\"", "\"1mbit\"", "\"0.3mbit\"", "\"50%\"", "\"150%\"", "\"0bit\"", "\"20mbit\"", "1000000"]
        }
        "overhead" | "prio" | "weight" | "mark" => {
            vec!["0", "1", "7", "8", "-1", "-65", "256", "257", "0x10", "4294967296"]
        }
        "replace_qdisc" | "aqm" => vec!["true", "false"],
        "direction" => vec!["\"upload\"", "\"download\"", "\"up\""],
        "isolation" => vec!["\"host\"", "\"flow\"", "\"none\"", "\"hosts\""],
        "horizon" | "aqm_target" | "aqm_interval" | "tick" => {
            vec!["\"10ms\"", "\"1s\"", "\"0s\"", "\"11s\"", "\"50us\"", "\"200ms\"", "\"1µs\"", "\"5\""]
        }
        "src" | "dst" => vec![
            "\"192.168.1.110\"",
            "\"10.0.0.0/8\"",
            "\"10.0.0.1/8\"",
            "\"::/0\"",
            "\"fd00::1\"",
            "\"fd00::/129\"",
            "\"host\"",
        ],
        "proto" => vec!["\"tcp\"", "\"udp\"", "\"icmp\"", "\"gre\"", "6", "300", "\"foo\""],
        "sport" | "dport" => vec!["80", "\"443\"", "\"3072-4095\"", "\"5-1\"", "65536", "\"0-65535\"", "\"x\""],
        "dscp" => vec!["\"ef\"", "46", "64", "\"cs8\"", "\"af41\"", "\"le\""],
        "socket" => vec!["\"/run/shaper/x.sock\"", "\"\"", "\"relative.sock\""],
        _ => VALUES.to_vec(),
    }
}

/// The keys of a table with header `header`.
fn keys_of(header: &str) -> Vec<&'static str> {
    match header {
        "[[interface]]" => INTERFACE_KEYS.to_vec(),
        "[[class]]" => CLASS_KEYS.to_vec(),
        "[[rule]]" => RULE_KEYS.to_vec(),
        "[daemon]" => DAEMON_KEYS.to_vec(),
        _ => keys(),
    }
}

/// A table of the configuration: its header, then some of its keys (each once) with values
/// that suit them mostly, and now and then a key of another table.
fn table() -> impl Strategy<Value = String> {
    let header = prop_oneof![
        30 => select(vec!["[[interface]]", "[[class]]", "[[class]]", "[[rule]]", "[[rule]]"]),
        1 => select(vec!["[interface]", "[[daemon]]", "[extra]", "[class"]),
    ];
    header.prop_flat_map(table_of)
}

/// A table with header `header` and some of its keys.
fn table_of(header: &'static str) -> impl Strategy<Value = String> {
    let keys = keys_of(header);
    let n = keys.len();
    let lines = prop::sample::subsequence(keys, 0..=n).prop_flat_map(|keys| {
        keys.into_iter()
            .map(|k| {
                prop_oneof![30 => select(values_of(k)).prop_map(str::to_owned), 1 => value()]
                    .prop_map(move |v| format!("{k} = {v}"))
            })
            .collect::<Vec<_>>()
    });
    (lines, prop::option::weighted(0.03, key_line())).prop_map(move |(mut lines, stray)| {
        lines.extend(stray);
        format!("{header}\n{}\n", lines.join("\n"))
    })
}

/// A text shaped like a configuration: tables with keys, a valid skeleton mostly so that the
/// validation of classes and rules is reached, not only the TOML reader.
fn config_like() -> impl Strategy<Value = String> {
    let skeleton = prop_oneof![
        1 => Just(String::new()),
        3 => Just("[[interface]]\nname = \"lan0\"\nrate = \"10mbit\"\ndefault = \"guest\"\n\n[[class]]\nname = \"guest\"\nrate = \"1mbit\"\n".to_owned()),
    ];
    let daemon = prop::option::weighted(0.3, table_of("[daemon]"));
    (skeleton, daemon, prop::collection::vec(table(), 0..8))
        .prop_map(|(s, d, tables)| format!("{s}\n{}\n{}", d.unwrap_or_default(), tables.concat()))
}

/// A change to a valid configuration's text.
#[derive(Clone, Debug)]
enum Mutation {
    DeleteLine(prop::sample::Index),
    DuplicateLine(prop::sample::Index),
    SwapLines(prop::sample::Index, prop::sample::Index),
    /// Replace what follows the `=` of a line by another value.
    ReplaceValue(prop::sample::Index, String),
    InsertLine(prop::sample::Index, String),
    /// Insert a character at a character boundary.
    InsertChar(prop::sample::Index, char),
    Truncate(prop::sample::Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    use prop::sample::Index;
    prop_oneof![
        2 => any::<Index>().prop_map(Mutation::DeleteLine),
        1 => any::<Index>().prop_map(Mutation::DuplicateLine),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        4 => (any::<Index>(), value()).prop_map(|(i, v)| Mutation::ReplaceValue(i, v)),
        2 => (any::<Index>(), prop_oneof![key_line(), table()]).prop_map(|(i, l)| Mutation::InsertLine(i, l)),
        2 => (any::<Index>(), prop_oneof![select(vec!['"', '[', ']', '=', '\n', '#', '\\', '{', '.', '\0']), any::<char>()])
            .prop_map(|(i, c)| Mutation::InsertChar(i, c)),
        1 => any::<Index>().prop_map(Mutation::Truncate),
    ]
}

fn mutate(text: &str, mutations: &[Mutation]) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    for m in mutations {
        if lines.is_empty() {
            lines.push(String::new());
        }
        let n = lines.len();
        match m {
            Mutation::DeleteLine(i) => {
                lines.remove(i.index(n));
            }
            Mutation::DuplicateLine(i) => {
                let line = lines[i.index(n)].clone();
                lines.insert(i.index(n), line);
            }
            Mutation::SwapLines(a, b) => lines.swap(a.index(n), b.index(n)),
            Mutation::ReplaceValue(i, v) => {
                let line = &mut lines[i.index(n)];
                if let Some(eq) = line.find('=') {
                    line.truncate(eq + 1);
                    line.push(' ');
                    line.push_str(v);
                }
            }
            Mutation::InsertLine(i, l) => lines.insert(i.index(n + 1), l.clone()),
            Mutation::InsertChar(i, c) => {
                let line = &mut lines[i.index(n)];
                let at =
                    line.char_indices().map(|(at, _)| at).chain([line.len()]).nth(i.index(line.chars().count() + 1));
                line.insert(at.unwrap_or(line.len()), *c);
            }
            Mutation::Truncate(i) => {
                let mut text = lines.join("\n");
                let cut = text.char_indices().map(|(at, _)| at).nth(i.index(text.chars().count().max(1)));
                text.truncate(cut.unwrap_or(text.len()));
                lines = text.lines().map(str::to_owned).collect();
            }
        }
    }
    lines.join("\n")
}

/// Parses `text` and checks what came out: a configuration that is what its own text says and
/// whose rules compile or are refused with an error; or an error that names the file and a line
/// of the text (and a key, for an invalid value).
fn check_config(text: &str) -> Result<(), TestCaseError> {
    match Config::parse(text, Path::new(PATH)) {
        Ok(config) => {
            let again = Config::parse(&config.text, Path::new(PATH));
            prop_assert_eq!(again.as_ref().ok(), Some(&config), "parsing the same text again");
            let ids: Vec<u32> = (0..u32::try_from(config.classes.len()).unwrap()).collect();
            // The rules fit in the datapath, or the error says why: never a panic.
            let _ = rules::compile(&rule_specs(&config, &ids));
        }
        Err(e) => check_error_location(&e, text)?,
    }
    Ok(())
}

fn check_error_location(e: &ConfigError, text: &str) -> Result<(), TestCaseError> {
    let message = e.to_string();
    let line = e.line();
    prop_assert!(line.is_some(), "an error of a text names a line: {}", message);
    let line = line.unwrap();
    // A missing table or key is reported at the end of the text, one past its last line.
    let last = text.lines().count() + 1;
    prop_assert!((1..=last).contains(&line), "line {} not in the text's 1..={}: {}", line, last, message);
    prop_assert!(message.starts_with(&format!("{PATH}:{line}:")), "the message starts with file:line: {}", message);
    if let ConfigError::Invalid { key, .. } = e {
        prop_assert!(!key.is_empty(), "an invalid value's error names its key: {}", message);
    }
    Ok(())
}

/// How the texts of a run fared, so that a generator that no longer reaches validation shows.
#[derive(Debug, Default)]
struct Fared {
    valid: u32,
    syntax: u32,
    invalid: u32,
}

/// Runs `cases` texts from `texts` through [`check_config`].
fn run_config_cases(texts: impl Strategy<Value = String>, cases: u32) -> Fared {
    let config = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
    let fared = std::cell::RefCell::new(Fared::default());
    let result = proptest::test_runner::TestRunner::new(config).run(&texts, |text| {
        let mut fared = fared.borrow_mut();
        match Config::parse(&text, Path::new(PATH)) {
            Ok(_) => fared.valid += 1,
            Err(ConfigError::Syntax { .. }) => fared.syntax += 1,
            Err(_) => fared.invalid += 1,
        }
        check_config(&text)
    });
    if let Err(e) = result {
        panic!("{e}");
    }
    let fared = fared.into_inner();
    println!("{fared:?}");
    fared
}

/// Any text at all: an error (a syntax error, mostly) with its location, never a panic.
#[test]
fn the_config_loader_takes_any_text() {
    let fared = run_config_cases(any::<String>(), 2000);
    assert!(fared.syntax > 0, "{fared:?}");
}

/// Texts shaped like configurations, which get past the TOML reader into validation.
#[test]
fn the_config_loader_takes_config_like_text() {
    let fared = run_config_cases(config_like(), 3000);
    assert!(fared.invalid > 1000 && fared.syntax > 0, "{fared:?}");
}

/// The example configurations, damaged: deleted, repeated and swapped lines, values replaced,
/// lines and characters inserted, the text cut short.
#[test]
fn the_config_loader_takes_damaged_examples() {
    let texts = (select(EXAMPLES.to_vec()), prop::collection::vec(mutation(), 1..5))
        .prop_map(|(example, mutations)| mutate(example, &mutations));
    let fared = run_config_cases(texts, 3000);
    assert!(fared.valid > 100 && fared.invalid > 500 && fared.syntax > 100, "{fared:?}");
}

// ---------------------------------------------------------------------------------------------
// Requests.

/// Rates as a request may spell them: integers (bits/s) and strings in tc's spelling, sound
/// or not.
fn rate_json() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<u64>().prop_map(|v| v.to_string()),
        1 => any::<i64>().prop_map(|v| v.to_string()),
        1 => select(vec!["1.5", "-0", "1e3", "18446744073709551616", "null", "true", "[]", "{}"]).prop_map(str::to_owned),
        3 => ("[0-9]{0,22}(\\.[0-9]{0,22})?", select(vec!["", "bit", "kbit", "mbit", "gbit", "tbit", "bps", "kbps", "mbps", "gbps", "tbps", "kibit", "mibit", "%", "Mbit", " mbit", "xbit"]))
            .prop_map(|(n, u)| format!("\"{n}{u}\"")),
    ]
}

fn json_value() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => rate_json(),
        1 => "\"[a-z]{0,8}\"",
        1 => select(vec!["0", "7", "255", "256", "-1", "true", "false", "null", "\"\"", "\"\\u0000\"", "\"\\ud800\""]).prop_map(str::to_owned),
    ]
}

/// A JSON object with a `cmd` (a command or not) and random fields of the requests.
fn request_like() -> impl Strategy<Value = String> {
    let cmd = prop_oneof![
        4 => select(vec!["status", "set-rate", "set-ceil", "set-prio", "reload"]).prop_map(|c| format!("\"{c}\"")),
        1 => select(vec!["\"reboot\"", "\"Status\"", "1", "null", "\"\""]).prop_map(str::to_owned),
    ];
    let field = (select(vec!["class", "rate", "ceil", "prio", "save", "cmd", "x"]), json_value());
    (cmd, prop::collection::vec(field, 0..5)).prop_map(|(cmd, fields)| {
        let mut parts = vec![format!("\"cmd\":{cmd}")];
        parts.extend(fields.into_iter().map(|(k, v)| format!("\"{k}\":{v}")));
        format!("{{{}}}", parts.join(","))
    })
}

/// A request, any class name, rate, priority.
fn request() -> impl Strategy<Value = Request> {
    let class = "[ -~]{0,12}";
    let rate = any::<u64>().prop_map(Rate::from_bits_per_sec);
    prop_oneof![
        Just(Request::Status {}),
        Just(Request::Reload {}),
        (class, rate.clone(), any::<bool>()).prop_map(|(class, rate, save)| Request::SetRate { class, rate, save }),
        (class, rate, any::<bool>()).prop_map(|(class, ceil, save)| Request::SetCeil { class, ceil, save }),
        (class, any::<u8>(), any::<bool>()).prop_map(|(class, prio, save)| Request::SetPrio { class, prio, save }),
    ]
}

/// Request lines as a client may send them: requests, request-like objects, valid requests
/// damaged, arbitrary text and bytes. Never a newline inside.
fn line() -> impl Strategy<Value = Vec<u8>> {
    let valid = prop_oneof![
        Just(r#"{"cmd":"status"}"#.to_owned()),
        Just(r#"{"cmd":"set-rate","class":"alex","rate":"2mbit"}"#.to_owned()),
        Just(r#"{"cmd":"set-ceil","class":"alex","ceil":8000000,"save":true}"#.to_owned()),
        Just(r#"{"cmd":"set-prio","class":"alex","prio":0}"#.to_owned()),
        Just(r#"{"cmd":"reload"}"#.to_owned()),
    ];
    let damaged = (valid, prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<bool>()), 1..4))
        .prop_map(|(text, edits)| {
            let mut bytes = text.into_bytes();
            for (at, b, insert) in edits {
                let i = at.index(bytes.len());
                if insert {
                    bytes.insert(i, b);
                } else {
                    bytes[i] = b;
                }
            }
            bytes
        });
    prop_oneof![
        4 => request().prop_map(|r| serde_json::to_vec(&r).unwrap()),
        4 => request_like().prop_map(String::into_bytes),
        3 => damaged,
        1 => any::<String>().prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..200),
    ]
    .prop_map(|mut bytes| {
        bytes.retain(|&b| b != b'\n');
        bytes
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, failure_persistence: None, ..ProptestConfig::default() })]

    /// The decoder gives a request or an error, and a request it gives is written and read
    /// back the same (what shaperctl sends is what shaperd reads).
    #[test]
    fn the_request_decoder_takes_any_line(line in line()) {
        if let Ok(request) = serde_json::from_slice::<Request>(&line) {
            let text = serde_json::to_string(&request).unwrap();
            prop_assert_eq!(serde_json::from_str::<Request>(&text).ok(), Some(request));
        }
    }

    /// A rate that a request carries is exactly the rate the configuration gets: the daemon
    /// hands it to the configuration edit in its written form (`Rate`'s `Display`).
    #[test]
    fn a_requested_rate_reads_back_exactly(rate in rate_json()) {
        if let Ok(rate) = serde_json::from_str::<Rate>(&rate) {
            prop_assert_eq!(rate.to_string().parse::<Rate>().ok(), Some(rate), "{}", rate);
        }
    }
}

/// A handler that counts the requests it is given and answers each with that count.
#[derive(Default)]
struct Counting(AtomicU64);

impl Handler for Counting {
    async fn handle(&self, _request: Request) -> Reply {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        Ok(Response::Changed { generation: n, changes: Vec::new(), saved: None })
    }
}

/// Through a real control socket: each line that is a request gets the handler's reply; a line
/// that is not gets a `bad-request` reply without the handler hearing of it, and the
/// connection is closed (the client then opens another for the lines left).
#[test]
fn the_control_socket_answers_garbage_with_bad_request_and_never_hands_it_on() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("shaper.sock");
    let handler = Arc::new(Counting::default());
    let server = runtime.block_on(Server::bind(&path)).unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = runtime.spawn({
        let handler = Arc::clone(&handler);
        async move { server.serve(handler, async { stopped.await.unwrap_or(()) }).await }
    });

    let config = ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let (requests, garbage) = (AtomicU64::new(0), AtomicU64::new(0));
    let result = runner.run(&prop::collection::vec(line(), 1..12), |lines| {
        runtime.block_on(async {
            let mut stream: Option<BufReader<tokio::net::UnixStream>> = None;
            for line in &lines {
                if stream.is_none() {
                    stream = Some(BufReader::new(tokio::net::UnixStream::connect(&path).await.unwrap()));
                }
                let conn = stream.as_mut().unwrap();
                // Far below MAX_LINE, whose own reply the api's unit tests check.
                prop_assert!(line.len() < MAX_LINE);
                let calls = handler.0.load(Ordering::SeqCst);
                let mut framed = line.clone();
                framed.push(b'\n');
                conn.get_mut().write_all(&framed).await.unwrap();
                let mut reply = String::new();
                conn.read_line(&mut reply).await.unwrap();
                let reply: Reply = serde_json::from_str(&reply)
                    .map_err(|e| TestCaseError::fail(format!("the reply is not a reply ({e}): {reply:?}")))?;
                let shown = String::from_utf8_lossy(line);
                if serde_json::from_slice::<Request>(line).is_ok() {
                    requests.fetch_add(1, Ordering::Relaxed);
                    let expected = Ok(Response::Changed { generation: calls + 1, changes: Vec::new(), saved: None });
                    prop_assert_eq!(reply, expected, "the reply to request {:?}", shown);
                } else {
                    garbage.fetch_add(1, Ordering::Relaxed);
                    prop_assert!(
                        matches!(reply, Err(ApiError::BadRequest { .. })),
                        "the reply to {:?}: {:?}",
                        shown,
                        reply
                    );
                    prop_assert_eq!(handler.0.load(Ordering::SeqCst), calls, "the handler heard of {:?}", shown);
                    let mut rest = Vec::new();
                    conn.read_to_end(&mut rest).await.unwrap();
                    prop_assert!(rest.is_empty(), "the connection is closed after a bad request");
                    stream = None;
                }
            }
            Ok(())
        })
    });
    stop.send(()).unwrap();
    runtime.block_on(serving).unwrap();
    if let Err(e) = result {
        panic!("{e}");
    }
    let (requests, garbage) = (requests.into_inner(), garbage.into_inner());
    println!("{requests} requests and {garbage} lines of garbage sent");
    assert!(requests > 300 && garbage > 300, "{requests} requests, {garbage} garbage lines: the generator is off");
}

// ---------------------------------------------------------------------------------------------
// Runtime changes.

/// A class name the examples have, or not.
fn class_name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => select(vec!["alex", "betty", "carl", "guest", "staff", "voip", "interactive", "bulk", "servers", "web", "backup", "vpn-bulk"]).prop_map(str::to_owned),
        1 => "[a-z-]{0,10}",
    ]
}

fn change() -> impl Strategy<Value = (ClassKey, NewValue)> {
    let rate_text = prop_oneof![
        3 => any::<u64>().prop_map(|bits| Rate::from_bits_per_sec(bits % 200_000_000).to_string()),
        1 => "[0-9]{1,4}(\\.[0-9]{1,3})?(bit|kbit|mbit|gbit|%)",
        1 => "[ -~]{0,12}",
    ];
    prop_oneof![
        (select(vec![ClassKey::Rate, ClassKey::Ceil]), rate_text).prop_map(|(k, r)| (k, NewValue::Rate(r))),
        any::<u8>().prop_map(|p| (ClassKey::Prio, NewValue::Prio(p))),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, failure_persistence: None, ..ProptestConfig::default() })]

    /// A runtime change (set-rate, set-ceil, set-prio, random and mostly invalid) on an example
    /// configuration either is refused, with an error that names the class or the key, or gives
    /// the configuration its new text describes, in which the class has the new value and
    /// nothing else changed but what follows from it (rates given as a share of that class's).
    #[test]
    fn a_runtime_change_is_whole_or_refused(example in select(EXAMPLES.to_vec()), class in class_name(), (key, value) in change()) {
        let old = Config::parse(example, Path::new(PATH)).unwrap();
        match set_class_key(example, Path::new(PATH), &class, key, &value) {
            Err(EditError::UnknownClass { .. }) => prop_assert!(old.class(&class).is_none(), "{} exists", class),
            Err(EditError::Invalid { source, .. }) => {
                prop_assert!(old.class(&class).is_some());
                check_error_location(&source, example)?;
            }
            Err(e) => prop_assert!(false, "a valid text gave {}", e),
            Ok((text, new)) => {
                let again = Config::parse(&text, Path::new(PATH));
                prop_assert_eq!(again.as_ref().ok(), Some(&new));
                let changed = new.class(&class).expect("the changed class");
                match (&value, key) {
                    (NewValue::Prio(p), ClassKey::Prio) => prop_assert_eq!(changed.prio, *p),
                    (NewValue::Rate(r), ClassKey::Rate) if !r.contains('%') => prop_assert_eq!(Some(changed.rate), r.parse().ok()),
                    (NewValue::Rate(r), ClassKey::Ceil) if !r.contains('%') => prop_assert_eq!(Some(changed.ceil), r.parse().ok()),
                    _ => {}
                }
                prop_assert_eq!(&new.daemon, &old.daemon);
                prop_assert_eq!(&new.interfaces, &old.interfaces);
                // Rules are the same but for their lines, which a key added above them moves.
                let unlined = |c: &Config| c.rules.iter().map(|r| shaper::config::Rule { line: 0, ..r.clone() }).collect::<Vec<_>>();
                prop_assert_eq!(unlined(&new), unlined(&old));
                prop_assert_eq!(new.classes.len(), old.classes.len());
                for (n, o) in new.classes.iter().zip(&old.classes) {
                    prop_assert_eq!((&n.name, &n.interface, &n.parent), (&o.name, &o.interface, &o.parent));
                    if n.name != class {
                        prop_assert_eq!((n.prio, n.weight, n.horizon, n.aqm, n.isolation), (o.prio, o.weight, o.horizon, o.aqm, o.isolation));
                    }
                }
            }
        }
    }
}
