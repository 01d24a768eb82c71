//! The embedded tc program: loading, attaching at egress, and typed access to its maps.
//!
//! The object is built from `shaper-ebpf` by `build.rs` and embedded in the binary, so
//! `shaperd` has no file to find at run time.

use aya::{
    maps::{Array, HashMap, MapData, MapError, PerCpuArray, PerCpuValues},
    programs::{
        tc::{self, SchedClassifierLinkId, TcError},
        ProgramError, SchedClassifier, TcAttachType,
    },
    util::KernelVersion,
    Ebpf, EbpfError, EbpfLoader,
};
use shaper_common::{
    maps, ClassConfig, ClassState, ClassStats, Globals, IfaceConfig, RuleKey, RuleTarget, Tuple, MAX_CLASSES,
    MAX_TUPLES, PASS_PROGRAM_NAME, PORT_SLOTS, PROGRAM_NAME,
};

use crate::rules::Compiled;

/// The tc program, compiled for `bpfel-unknown-none`.
pub static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/shaper.bpf.o"));

/// Errors from loading, attaching or accessing the datapath.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("loading the embedded BPF object")]
    Load(#[source] EbpfError),
    #[error("the BPF object has no program `{PROGRAM_NAME}`, or it is not a tc classifier")]
    NoProgram(#[source] Option<ProgramError>),
    #[error("the kernel rejected the tc program")]
    Verify(#[source] ProgramError),
    #[error("the BPF object has no map `{0}`")]
    NoMap(&'static str),
    #[error("map `{name}`: {action}")]
    Map {
        name: &'static str,
        action: String,
        #[source]
        source: MapError,
    },
    #[error("adding the clsact qdisc to {iface}")]
    Clsact {
        iface: String,
        #[source]
        source: TcError,
    },
    #[error("attaching the tc program to egress of {iface}")]
    Attach {
        iface: String,
        #[source]
        source: ProgramError,
    },
    #[error("detaching the tc program from {iface}")]
    Detach {
        iface: String,
        #[source]
        source: ProgramError,
    },
    #[error("class id {0} is out of range (at most {MAX_CLASSES} classes)")]
    ClassId(u32),
}

fn map_err(name: &'static str, action: impl Into<String>) -> impl FnOnce(MapError) -> BpfError {
    let action = action.into();
    move |source| BpfError::Map { name, action, source }
}

/// How the program is attached to an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// A TCX link (kernel 6.6 and later).
    Tcx,
    /// A `cls_bpf` filter under the clsact qdisc (older kernels).
    Clsact,
}

/// The loaded datapath: the program, its attachments and its maps.
pub struct Datapath {
    ebpf: Ebpf,
    ifaces: HashMap<MapData, u32, IfaceConfig>,
    globals: Array<MapData, Globals>,
    tuples: Array<MapData, Tuple>,
    rules: HashMap<MapData, RuleKey, RuleTarget>,
    sport_ids: Array<MapData, u16>,
    dport_ids: Array<MapData, u16>,
    class_config: Array<MapData, ClassConfig>,
    class_state: Array<MapData, ClassState>,
    class_stats: PerCpuArray<MapData, ClassStats>,
    links: Vec<(String, SchedClassifierLinkId)>,
    /// Interfaces whose clsact qdisc this process added (removed again on detach).
    added_clsact: Vec<String>,
    /// What each rule bank holds, as written by this process (`None`: unknown, written by an
    /// earlier process into pinned maps).
    banks: [Option<BankContents>; 2],
}

/// The `RULES` keys and the ports with interval ids that one rule bank holds.
#[derive(Default)]
struct BankContents {
    keys: Vec<RuleKey>,
    ports: Vec<u32>,
}

fn take<T: TryFrom<aya::maps::Map, Error = MapError>>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, BpfError> {
    let map = ebpf.take_map(name).ok_or(BpfError::NoMap(name))?;
    T::try_from(map).map_err(map_err(name, "unexpected map type"))
}

impl Datapath {
    /// Loads the embedded object and the program into the kernel (not yet attached).
    pub fn load() -> Result<Self, BpfError> {
        let mut ebpf = EbpfLoader::new().load(OBJECT).map_err(BpfError::Load)?;
        let program: &mut SchedClassifier = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(BpfError::NoProgram(None))?
            .try_into()
            .map_err(|e| BpfError::NoProgram(Some(e)))?;
        program.load().map_err(BpfError::Verify)?;
        Ok(Self {
            ifaces: take(&mut ebpf, maps::IFACES)?,
            globals: take(&mut ebpf, maps::GLOBALS)?,
            tuples: take(&mut ebpf, maps::TUPLES)?,
            rules: take(&mut ebpf, maps::RULES)?,
            sport_ids: take(&mut ebpf, maps::SPORT_IDS)?,
            dport_ids: take(&mut ebpf, maps::DPORT_IDS)?,
            class_config: take(&mut ebpf, maps::CLASS_CONFIG)?,
            class_state: take(&mut ebpf, maps::CLASS_STATE)?,
            class_stats: take(&mut ebpf, maps::CLASS_STATS)?,
            ebpf,
            links: Vec::new(),
            added_clsact: Vec::new(),
            // Fresh maps: both banks are empty.
            banks: [Some(BankContents::default()), Some(BankContents::default())],
        })
    }

    /// The loaded program (for `BPF_PROG_TEST_RUN`).
    #[must_use]
    pub fn program(&self) -> &SchedClassifier {
        self.ebpf.program(PROGRAM_NAME).and_then(|p| <&SchedClassifier>::try_from(p).ok()).expect("checked in load()")
    }

    /// Loads (once) and returns the program that does nothing, for benchmarks.
    pub fn pass_program(&mut self) -> Result<&SchedClassifier, BpfError> {
        let program: &mut SchedClassifier = self
            .ebpf
            .program_mut(PASS_PROGRAM_NAME)
            .ok_or(BpfError::NoProgram(None))?
            .try_into()
            .map_err(|e| BpfError::NoProgram(Some(e)))?;
        if program.fd().is_err() {
            program.load().map_err(BpfError::Verify)?;
        }
        Ok(program)
    }

    fn program_mut(&mut self) -> &mut SchedClassifier {
        self.ebpf
            .program_mut(PROGRAM_NAME)
            .and_then(|p| <&mut SchedClassifier>::try_from(p).ok())
            .expect("checked in load()")
    }

    /// The mechanism `attach` uses on this kernel.
    #[must_use]
    pub fn attach_mode() -> AttachMode {
        // The same test aya's `SchedClassifier::attach` makes to choose TCX.
        if KernelVersion::current().is_ok_and(|v| v >= KernelVersion::new(6, 6, 0)) {
            AttachMode::Tcx
        } else {
            AttachMode::Clsact
        }
    }

    /// Attaches the program at egress of `iface`: a TCX link where the kernel has TCX,
    /// otherwise a filter under clsact (added first if missing).
    pub fn attach(&mut self, iface: &str) -> Result<AttachMode, BpfError> {
        let mode = Self::attach_mode();
        if mode == AttachMode::Clsact {
            match tc::qdisc_add_clsact(iface) {
                Ok(()) => self.added_clsact.push(iface.to_owned()),
                Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(source) => return Err(BpfError::Clsact { iface: iface.to_owned(), source }),
            }
        }
        let link = self
            .program_mut()
            .attach(iface, TcAttachType::Egress)
            .map_err(|source| BpfError::Attach { iface: iface.to_owned(), source })?;
        self.links.push((iface.to_owned(), link));
        Ok(mode)
    }

    /// Detaches from every interface. Returns the interfaces whose clsact qdisc this process
    /// added, for the caller to remove (see [`crate::qdisc::delete_clsact`]).
    pub fn detach_all(&mut self) -> Result<Vec<String>, BpfError> {
        let mut first_err = None;
        for (iface, link) in std::mem::take(&mut self.links) {
            if let Err(source) = self.program_mut().detach(link) {
                first_err.get_or_insert(BpfError::Detach { iface, source });
            }
        }
        let added = std::mem::take(&mut self.added_clsact);
        first_err.map_or(Ok(added), Err)
    }

    /// Interface names the program is attached to.
    pub fn attached(&self) -> impl Iterator<Item = &str> {
        self.links.iter().map(|(i, _)| i.as_str())
    }

    /// Sets an interface's slot, default class and overhead.
    pub fn set_iface(&mut self, ifindex: u32, config: IfaceConfig) -> Result<(), BpfError> {
        self.ifaces.insert(ifindex, config, 0).map_err(map_err(maps::IFACES, format!("setting ifindex {ifindex}")))
    }

    /// Replaces the rule set: writes `compiled` into the inactive bank (see
    /// [`shaper_common::RULE_BANKS`]), then makes it the active one with a single write of
    /// `GLOBALS`, so that packets are classified by the old rules or the new ones, never by a
    /// mix. The bank written now was last active two rule sets ago; what it held is cleared
    /// first (packets that were still reading it have long finished).
    pub fn load_rules(&mut self, compiled: &Compiled) -> Result<(), BpfError> {
        let active = self.globals.get(&0, 0).map_err(map_err(maps::GLOBALS, "reading the active rule bank"))?.bank & 1;
        let bank = 1 - active;
        self.clear_bank(bank)?;
        let port_base = bank * PORT_SLOTS;
        let mut ports = Vec::new();
        for (port, (&s, &d)) in compiled.sport_ids.iter().zip(&compiled.dport_ids).enumerate() {
            let port = u32::try_from(port).expect("65536 ports");
            if s != 0 {
                self.sport_ids.set(port_base + port, s, 0).map_err(map_err(maps::SPORT_IDS, format!("port {port}")))?;
            }
            if d != 0 {
                self.dport_ids.set(port_base + port, d, 0).map_err(map_err(maps::DPORT_IDS, format!("port {port}")))?;
            }
            if s != 0 || d != 0 {
                ports.push(port);
            }
        }
        let tuple_base = u16::try_from(bank * MAX_TUPLES).expect("small");
        let mut keys = Vec::with_capacity(compiled.entries.len());
        for (key, target) in &compiled.entries {
            let key = RuleKey { tuple: key.tuple + tuple_base, ..*key };
            self.rules
                .insert(key, target, 0)
                .map_err(map_err(maps::RULES, format!("inserting the entry of rule {}", target.rule)))?;
            keys.push(key);
        }
        for (i, tuple) in compiled.tuples.iter().enumerate() {
            let i = bank * MAX_TUPLES + u32::try_from(i).expect("at most MAX_TUPLES");
            self.tuples.set(i, tuple, 0).map_err(map_err(maps::TUPLES, format!("tuple {i}")))?;
        }
        let count = u32::try_from(compiled.tuples.len()).expect("at most MAX_TUPLES");
        self.globals
            .set(0, Globals { tuple_count: count, bank }, 0)
            .map_err(map_err(maps::GLOBALS, "switching to the new rule bank"))?;
        self.banks[bank as usize] = Some(BankContents { keys, ports });
        Ok(())
    }

    /// Empties rule bank `bank`: the entries and port ids this process wrote there, or, for a
    /// bank written by an earlier process (pinned maps), every entry of the bank.
    fn clear_bank(&mut self, bank: u32) -> Result<(), BpfError> {
        let port_base = bank * PORT_SLOTS;
        let (keys, ports) = if let Some(BankContents { keys, ports }) = self.banks[bank as usize].take() {
            (keys, ports)
        } else {
            let range = bank * MAX_TUPLES..(bank + 1) * MAX_TUPLES;
            let keys: Vec<RuleKey> =
                self.rules.keys().filter_map(Result::ok).filter(|k| range.contains(&u32::from(k.tuple))).collect();
            (keys, (0..PORT_SLOTS).collect())
        };
        for key in &keys {
            match self.rules.remove(key) {
                Ok(()) | Err(MapError::KeyNotFound) => {}
                Err(source) => {
                    return Err(BpfError::Map { name: maps::RULES, action: "clearing a rule bank".into(), source })
                }
            }
        }
        for port in ports {
            self.sport_ids.set(port_base + port, 0, 0).map_err(map_err(maps::SPORT_IDS, format!("port {port}")))?;
            self.dport_ids.set(port_base + port, 0, 0).map_err(map_err(maps::DPORT_IDS, format!("port {port}")))?;
        }
        Ok(())
    }

    /// Sets a class's rate (bytes/s; 0 = unpaced) and drop horizon.
    pub fn set_class(&mut self, class: u32, config: ClassConfig) -> Result<(), BpfError> {
        if class >= MAX_CLASSES {
            return Err(BpfError::ClassId(class));
        }
        self.class_config.set(class, config, 0).map_err(map_err(maps::CLASS_CONFIG, format!("class {class}")))
    }

    /// Zeroes a class's counters and pacing state (for a class id that is given up).
    pub fn reset_class(&mut self, class: u32) -> Result<(), BpfError> {
        if class >= MAX_CLASSES {
            return Err(BpfError::ClassId(class));
        }
        let cpus = aya::util::nr_cpus().map_err(|(_, source)| BpfError::Map {
            name: maps::CLASS_STATS,
            action: "counting the possible CPUs".into(),
            source: MapError::IoError(source),
        })?;
        let zeros = PerCpuValues::try_from(vec![ClassStats::default(); cpus]).map_err(|source| BpfError::Map {
            name: maps::CLASS_STATS,
            action: format!("zeroing class {class}"),
            source: MapError::IoError(source),
        })?;
        self.class_stats.set(class, zeros, 0).map_err(map_err(maps::CLASS_STATS, format!("zeroing class {class}")))?;
        self.class_state
            .set(class, ClassState::default(), 0)
            .map_err(map_err(maps::CLASS_STATE, format!("zeroing class {class}")))
    }

    /// A class's current pacing parameters.
    pub fn class_config(&self, class: u32) -> Result<ClassConfig, BpfError> {
        self.class_config.get(&class, 0).map_err(map_err(maps::CLASS_CONFIG, format!("reading class {class}")))
    }

    /// A class's pacing clock.
    pub fn class_state(&self, class: u32) -> Result<ClassState, BpfError> {
        self.class_state.get(&class, 0).map_err(map_err(maps::CLASS_STATE, format!("reading class {class}")))
    }

    /// A class's counters, summed over CPUs.
    pub fn class_stats(&self, class: u32) -> Result<ClassStats, BpfError> {
        let per_cpu =
            self.class_stats.get(&class, 0).map_err(map_err(maps::CLASS_STATS, format!("reading class {class}")))?;
        Ok(per_cpu.iter().fold(ClassStats::default(), ClassStats::merge))
    }
}

impl Drop for Datapath {
    fn drop(&mut self) {
        if let Err(e) = self.detach_all() {
            tracing::warn!(error = %e, "detaching on drop");
        }
    }
}
