//! The embedded tc program: loading, attaching at egress, and typed access to its maps.
//!
//! The object is built from `shaper-ebpf` by `build.rs` and embedded in the binary, so
//! `shaperd` has no file to find at run time.

use std::{
    fs::File,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use aya::{
    maps::{Array, HashMap, MapData, MapError, PerCpuArray, PerCpuValues},
    programs::{
        links::{FdLink, Link as _, LinkOrder, PinnedLink},
        tc::{self, NlOptions, SchedClassifierLink, TcAttachOptions, TcError, TcHandle},
        ProgramError, SchedClassifier, TcAttachType,
    },
    util::KernelVersion,
    Ebpf, EbpfError, EbpfLoader,
};
use nix::{
    errno::Errno,
    fcntl::{Flock, FlockArg},
    mount::{mount, MsFlags},
    sys::stat::{major, minor},
    sys::statfs::{statfs, FsType, BPF_FS_MAGIC},
};
use shaper_common::{
    cache_mask, class_slots, flow_cache_expires, iface_slot, maps, ActiveClasses, CacheMasks, ClassConfig, ClassState,
    ClassStats, Globals, IfaceConfig, IfaceSlot, Origin, RuleKey, RuleTarget, Tuple, CACHE_SETS, CACHE_WAYS,
    FILTER_WORDS, IFB_PROGRAM_NAME, INGRESS_PROGRAM_NAME, MAP_LAYOUT_VERSION, MAX_TUPLES, PASS_PROGRAM_NAME,
    PORT_SLOTS, PROGRAM_NAME, RULES_PER_PACKET,
};

use crate::rules::{self, Compiled};

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
    #[error("attaching the tc program to {hook} of {iface}")]
    Attach {
        iface: String,
        hook: Hook,
        #[source]
        source: ProgramError,
    },
    #[error("detaching the tc program from {iface}")]
    Detach {
        iface: String,
        #[source]
        source: ProgramError,
    },
    #[error("listing the programs attached at egress of {iface}")]
    Query {
        iface: String,
        #[source]
        source: ProgramError,
    },
    #[error("class id {id} is out of range: the class arrays hold {slots} classes")]
    ClassId { id: u32, slots: u32 },
    #[error("{}: {action}", .path.display())]
    Pin {
        path: PathBuf,
        action: &'static str,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync + 'static>,
    },
    /// Another process holds the pin directory's lock: a shaperd shapes with those maps.
    #[error(
        "{}: in use by another shaperd{}, which shapes with these maps; stop it first (a second one would take \
         its datapath over), or give this one a --pin-dir of its own",
        .path.display(),
        .holder.map(|pid| format!(" (pid {pid})")).unwrap_or_default()
    )]
    PinsInUse { path: PathBuf, holder: Option<u32> },
}

/// The exclusive lock a shaperd holds on its pin directory for as long as it runs, so that a
/// second one started by mistake (by hand, or a unit next to a running one) finds the maps
/// taken before it touches anything. The kernel releases it when the process ends, however
/// it ends, so a shaperd after a crash, kill -9 or handover takes the maps over as before.
#[derive(Debug)]
pub struct PinLock {
    _lock: Flock<File>,
}

impl PinLock {
    /// Takes the lock of the pin directory `root` (created on bpffs if needed, bpffs mounted
    /// as [`Datapath::load_pinned`] would), or says which process holds it.
    pub fn take(root: &Path) -> Result<Self, BpfError> {
        ensure_bpffs(root)?;
        std::fs::create_dir_all(root).map_err(pin_err(root, "creating the pin directory"))?;
        let dir = File::open(root).map_err(pin_err(root, "opening the pin directory"))?;
        match Flock::lock(dir, FlockArg::LockExclusiveNonblock) {
            Ok(lock) => Ok(Self { _lock: lock }),
            Err((_, Errno::EWOULDBLOCK)) => {
                Err(BpfError::PinsInUse { path: root.to_owned(), holder: lock_holder(root) })
            }
            Err((_, errno)) => Err(BpfError::Pin {
                path: root.to_owned(),
                action: "locking the pin directory",
                source: Box::new(std::io::Error::from(errno)),
            }),
        }
    }
}

/// The process holding a `flock` on `path`, from `/proc/locks`, whose lines read
/// `1: FLOCK  ADVISORY  WRITE <pid> <major>:<minor>:<inode> 0 EOF` (device numbers in hex).
fn lock_holder(path: &Path) -> Option<u32> {
    let meta = std::fs::metadata(path).ok()?;
    let id = format!("{:02x}:{:02x}:{}", major(meta.dev()), minor(meta.dev()), meta.ino());
    std::fs::read_to_string("/proc/locks").ok()?.lines().find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields[..] {
            [_, "FLOCK", _, _, pid, file, ..] if file == id => pid.parse().ok(),
            _ => None,
        }
    })
}

fn pin_err<E: std::error::Error + Send + Sync + 'static>(
    path: &Path,
    action: &'static str,
) -> impl FnOnce(E) -> BpfError {
    let path = path.to_owned();
    move |e| BpfError::Pin { path, action, source: Box::new(e) }
}

/// Priority and handle of shaper's `cls_bpf` filter under clsact (kernels without TCX). They
/// are fixed so that a later shaperd finds the filter an earlier one left and replaces its
/// program in place: no packet leaves unshaped, and no second filter is added.
pub const FILTER_PRIORITY: u16 = 1;
pub const FILTER_HANDLE: u32 = 0x5A1F;

/// Where a program is attached on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// The shaper: egress of a shaped interface.
    Egress,
    /// Ingress of a LAN-side interface of a NAT gateway, where the packets' origins are
    /// recorded (see `shaper_common::Origin`).
    LanIngress,
    /// Ingress of an interface shaped on ingress (`direction = "ingress"`): its packets are
    /// redirected to its IFB device, at whose egress [`Hook::Egress`] shapes them.
    IfbRedirect,
}

impl Hook {
    fn program(self) -> &'static str {
        match self {
            Hook::Egress => PROGRAM_NAME,
            Hook::LanIngress => INGRESS_PROGRAM_NAME,
            Hook::IfbRedirect => IFB_PROGRAM_NAME,
        }
    }

    fn attach_type(self) -> TcAttachType {
        match self {
            Hook::Egress => TcAttachType::Egress,
            Hook::LanIngress | Hook::IfbRedirect => TcAttachType::Ingress,
        }
    }

    /// The prefix of the pins of TCX links at this hook in a layout's pin directory:
    /// `link-<interface>` at egress, `lan-<interface>` at ingress, `ifb-<interface>` for
    /// the redirect to an IFB device.
    fn pin_prefix(self) -> &'static str {
        match self {
            Hook::Egress => "link-",
            Hook::LanIngress => "lan-",
            Hook::IfbRedirect => "ifb-",
        }
    }

    /// The handle of shaper's filter at this hook under clsact (at [`FILTER_PRIORITY`]): the
    /// redirect's differs from the LAN-side recorder's, so that one never replaces the other
    /// on an interface that changes role between two shaperds.
    #[must_use]
    pub fn filter_handle(self) -> u32 {
        match self {
            Hook::Egress | Hook::LanIngress => FILTER_HANDLE,
            Hook::IfbRedirect => FILTER_HANDLE + 1,
        }
    }

    fn pin_name(self, iface: &str) -> String {
        format!("{}{iface}", self.pin_prefix())
    }
}

impl std::fmt::Display for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Hook::Egress => "egress",
            Hook::LanIngress => "ingress",
            Hook::IfbRedirect => "ingress (redirect to the IFB)",
        })
    }
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
    iface_slots: Array<MapData, IfaceSlot>,
    lan_ifaces: HashMap<MapData, u32, u32>,
    ifb_targets: HashMap<MapData, u32, u32>,
    origins: HashMap<MapData, u32, Origin>,
    globals: Array<MapData, Globals>,
    tuples: Array<MapData, Tuple>,
    rules: HashMap<MapData, RuleKey, RuleTarget>,
    rule_filter: Array<MapData, u64>,
    sport_ids: Array<MapData, u16>,
    dport_ids: Array<MapData, u16>,
    len_ids: Array<MapData, u16>,
    class_config: Array<MapData, ClassConfig>,
    class_state: Array<MapData, ClassState>,
    class_stats: PerCpuArray<MapData, ClassStats>,
    class_cache: Array<MapData, [u64; CACHE_WAYS as usize]>,
    cache_masks: Array<MapData, CacheMasks>,
    active: Array<MapData, ActiveClasses>,
    /// The slots of the class arrays: class ids are below it.
    class_slots: u32,
    links: Vec<Attached>,
    /// Where the maps (and TCX links) are pinned, if they are.
    pin_dir: Option<PathBuf>,
    /// Interfaces whose clsact qdisc this process added (removed again on detach).
    added_clsact: Vec<String>,
    /// What each rule bank holds, as far as known.
    banks: [BankContents; 2],
    /// While [`Datapath::all_or_nothing`] runs: the entries its writes replaced, oldest first.
    journal: Option<Vec<Undo>>,
}

/// A map entry as it was before a write, to put back if the change it belongs to fails.
enum Undo {
    Class(u32, ClassConfig),
    /// The rule bank that was active (what `GLOBALS` held before a switch).
    Rules(Globals),
    /// `None`: the interface had no entry.
    Iface(u32, Option<IfaceConfig>),
}

/// The program attached to one interface.
struct Attached {
    iface: String,
    hook: Hook,
    link: SchedClassifierLink,
    /// The bpffs pin that keeps a TCX link alive without this process.
    pin: Option<PathBuf>,
}

/// The `RULES` keys, the ports (and IP lengths) with interval ids and the `RULE_FILTER`
/// words with bits set that one rule bank holds; `None` when not known (written by an
/// earlier process into pinned maps).
#[derive(Default)]
struct BankContents {
    keys: Option<Vec<RuleKey>>,
    ports: Option<Vec<u32>>,
    filter: Option<Vec<u32>>,
}

impl BankContents {
    fn empty() -> Self {
        Self { keys: Some(Vec::new()), ports: Some(Vec::new()), filter: Some(Vec::new()) }
    }
}

/// Removes `ifindex` from an interface map; an entry that is not there is no error.
fn remove_ifindex<V: aya::Pod>(
    map: &mut HashMap<MapData, u32, V>,
    name: &'static str,
    ifindex: u32,
) -> Result<(), BpfError> {
    match map.remove(&ifindex) {
        Ok(()) | Err(MapError::KeyNotFound) => Ok(()),
        Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(Errno::ENOENT as i32) => Ok(()),
        Err(source) => Err(BpfError::Map { name, action: format!("removing ifindex {ifindex}"), source }),
    }
}

fn take<T: TryFrom<aya::maps::Map, Error = MapError>>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, BpfError> {
    let map = ebpf.take_map(name).ok_or(BpfError::NoMap(name))?;
    T::try_from(map).map_err(map_err(name, "unexpected map type"))
}

impl Datapath {
    /// Loads the embedded object and the program into the kernel (not yet attached), with
    /// maps of its own and class arrays of the fewest slots.
    pub fn load() -> Result<Self, BpfError> {
        Self::load_for(0)
    }

    /// [`Datapath::load`], with class arrays sized for a configuration of `classes` classes
    /// ([`class_slots`]).
    pub fn load_for(classes: usize) -> Result<Self, BpfError> {
        Self::from_loader(&mut EbpfLoader::new(), None, class_slots(classes))
    }

    /// Loads the program with its maps pinned in a directory under `root` (on bpffs, mounted
    /// at `/sys/fs/bpf` if nothing is there yet), so that they outlive this process. Maps an
    /// earlier shaperd pinned there are taken over with their contents: the class clocks,
    /// counters and rules carry on, and the class arrays keep the slots they were given.
    /// Otherwise the class arrays are sized for `classes` classes ([`class_slots`]).
    /// Returns whether the maps were taken over.
    pub fn load_pinned(root: &Path, classes: usize) -> Result<(Self, bool), BpfError> {
        ensure_bpffs(root)?;
        let dir = root.join(format!("v{MAP_LAYOUT_VERSION}"));
        std::fs::create_dir_all(&dir).map_err(pin_err(&dir, "creating the pin directory"))?;
        let adopted = dir.join(maps::GLOBALS).exists();
        let slots = if adopted {
            let pin = dir.join(maps::CLASS_CONFIG);
            aya::maps::MapInfo::from_pin(&pin)
                .map_err(map_err(maps::CLASS_CONFIG, format!("reading the size of {}", pin.display())))?
                .max_entries()
        } else {
            class_slots(classes)
        };
        let mut loader = EbpfLoader::new();
        for name in maps::ALL {
            loader.map_pin_path(name, dir.join(name));
        }
        let mut datapath = Self::from_loader(&mut loader, Some(dir), slots)?;
        if adopted {
            // What the rule banks hold was written by the earlier process.
            datapath.banks = [BankContents::default(), BankContents::default()];
        }
        Ok((datapath, adopted))
    }

    fn from_loader(loader: &mut EbpfLoader<'_>, pin_dir: Option<PathBuf>, class_slots: u32) -> Result<Self, BpfError> {
        for name in [maps::CLASS_CONFIG, maps::CLASS_STATE, maps::CLASS_STATS] {
            loader.map_max_entries(name, class_slots);
        }
        let mut ebpf = loader.load(OBJECT).map_err(BpfError::Load)?;
        let program: &mut SchedClassifier = ebpf
            .program_mut(PROGRAM_NAME)
            .ok_or(BpfError::NoProgram(None))?
            .try_into()
            .map_err(|e| BpfError::NoProgram(Some(e)))?;
        program.load().map_err(BpfError::Verify)?;
        let ingress: &mut SchedClassifier = ebpf
            .program_mut(INGRESS_PROGRAM_NAME)
            .ok_or(BpfError::NoProgram(None))?
            .try_into()
            .map_err(|e| BpfError::NoProgram(Some(e)))?;
        ingress.load().map_err(BpfError::Verify)?;
        let redirect: &mut SchedClassifier = ebpf
            .program_mut(IFB_PROGRAM_NAME)
            .ok_or(BpfError::NoProgram(None))?
            .try_into()
            .map_err(|e| BpfError::NoProgram(Some(e)))?;
        redirect.load().map_err(BpfError::Verify)?;
        Ok(Self {
            ifaces: take(&mut ebpf, maps::IFACES)?,
            iface_slots: take(&mut ebpf, maps::IFACE_SLOTS)?,
            lan_ifaces: take(&mut ebpf, maps::LAN_IFACES)?,
            ifb_targets: take(&mut ebpf, maps::IFB_TARGETS)?,
            origins: take(&mut ebpf, maps::ORIGINS)?,
            globals: take(&mut ebpf, maps::GLOBALS)?,
            tuples: take(&mut ebpf, maps::TUPLES)?,
            rules: take(&mut ebpf, maps::RULES)?,
            rule_filter: take(&mut ebpf, maps::RULE_FILTER)?,
            sport_ids: take(&mut ebpf, maps::SPORT_IDS)?,
            dport_ids: take(&mut ebpf, maps::DPORT_IDS)?,
            len_ids: take(&mut ebpf, maps::LEN_IDS)?,
            class_config: take(&mut ebpf, maps::CLASS_CONFIG)?,
            class_state: take(&mut ebpf, maps::CLASS_STATE)?,
            class_stats: take(&mut ebpf, maps::CLASS_STATS)?,
            class_cache: take(&mut ebpf, maps::CLASS_CACHE)?,
            cache_masks: take(&mut ebpf, maps::CACHE_MASKS)?,
            active: take(&mut ebpf, maps::ACTIVE)?,
            class_slots,
            ebpf,
            links: Vec::new(),
            pin_dir,
            added_clsact: Vec::new(),
            // Fresh maps: both banks are empty.
            banks: [BankContents::empty(), BankContents::empty()],
            journal: None,
        })
    }

    /// The slots of the class arrays: every class id is below it.
    #[must_use]
    pub fn class_slots(&self) -> u32 {
        self.class_slots
    }

    /// The instructions the kernel's verifier walked to load the egress program (each path
    /// it could not prune walks its instructions again), if the kernel says (Linux 5.16+).
    /// The kernel refuses a program past 1,000,000; loading takes time in proportion.
    #[must_use]
    pub fn verified_instructions(&self) -> Option<u32> {
        self.program().info().ok().and_then(|info| info.verified_instruction_count())
    }

    /// The loaded shaper program (for `BPF_PROG_TEST_RUN`).
    #[must_use]
    pub fn program(&self) -> &SchedClassifier {
        self.program_at(Hook::Egress)
    }

    /// The loaded program for `hook` (for `BPF_PROG_TEST_RUN`).
    #[must_use]
    pub fn program_at(&self, hook: Hook) -> &SchedClassifier {
        self.ebpf.program(hook.program()).and_then(|p| <&SchedClassifier>::try_from(p).ok()).expect("checked in load()")
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

    /// The program attached at `hook` (both are loaded in `from_loader`).
    fn program_mut(&mut self, hook: Hook) -> &mut SchedClassifier {
        self.ebpf
            .program_mut(hook.program())
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
    /// otherwise a filter under clsact (added first if missing). An attachment an earlier
    /// shaperd left (its pinned TCX link, or its filter at [`FILTER_PRIORITY`] /
    /// [`FILTER_HANDLE`]) gets this program in its place, atomically. Returns the mode and
    /// whether an attachment was taken over.
    pub fn attach(&mut self, iface: &str, hook: Hook) -> Result<(AttachMode, bool), BpfError> {
        let mode = Self::attach_mode();
        let attach_err = |source| BpfError::Attach { iface: iface.to_owned(), hook, source };
        let (id, pin, adopted) = match mode {
            AttachMode::Clsact => {
                self.ensure_clsact(iface)?;
                let handle = TcHandle::from(hook.filter_handle());
                let existing = SchedClassifierLink::attached(iface, hook.attach_type(), FILTER_PRIORITY, handle, None)
                    .map_err(|e| attach_err(ProgramError::IOError(e)))?;
                // Without NLM_F_CREATE the kernel only replaces: ENOENT when there is nothing.
                if let Ok(id) = self.program_mut(hook).attach_to_link(existing) {
                    (id, None, true)
                } else {
                    let options = TcAttachOptions::Netlink(NlOptions {
                        priority: FILTER_PRIORITY,
                        handle,
                        ..NlOptions::default()
                    });
                    let id = self
                        .program_mut(hook)
                        .attach_with_options(iface, hook.attach_type(), options)
                        .map_err(attach_err)?;
                    (id, None, false)
                }
            }
            AttachMode::Tcx => {
                let pin = self.pin_dir.as_ref().map(|d| d.join(hook.pin_name(iface)));
                // This layout's pin, or one an earlier shaperd with another map layout left
                // (an upgrade): its link gets this program in place, and is pinned here.
                let found = pin.clone().filter(|p| p.exists()).or_else(|| self.older_link_pin(iface, hook));
                if let Some(path) = found.as_ref() {
                    let old = PinnedLink::from_pin(path).map_err(pin_err(path, "opening the pinned link"))?;
                    let link = SchedClassifierLink::try_from(FdLink::from(old))
                        .map_err(pin_err(path, "reading the pinned link"))?;
                    let id = self.program_mut(hook).attach_to_link(link).map_err(attach_err)?;
                    (id, pin, true)
                } else {
                    let options = TcAttachOptions::TcxOrder(LinkOrder::default());
                    let id = self
                        .program_mut(hook)
                        .attach_with_options(iface, hook.attach_type(), options)
                        .map_err(attach_err)?;
                    (id, pin, false)
                }
            }
        };
        let mut link = self.program_mut(hook).take_link(id).map_err(attach_err)?;
        if let Some(path) = pin.as_ref().filter(|p| !p.exists()) {
            // A pinned TCX link stays attached when this process exits, as a clsact filter does.
            let fd = FdLink::try_from(link).map_err(pin_err(path, "pinning the link"))?;
            let pinned = fd.pin(path).map_err(pin_err(path, "pinning the link"))?;
            link = SchedClassifierLink::try_from(FdLink::from(pinned)).map_err(pin_err(path, "pinning the link"))?;
            if let Some(older) = self.older_link_pin(iface, hook) {
                // Pinned here now; the older layout's pin would keep nothing alive but itself.
                std::fs::remove_file(&older).map_err(pin_err(&older, "removing an older layout's link pin"))?;
            }
        }
        self.links.push(Attached { iface: iface.to_owned(), hook, link, pin });
        Ok((mode, adopted))
    }

    /// Adds the clsact qdisc to `iface` if it has none, and records that it did (it is
    /// removed again on stop).
    pub fn ensure_clsact(&mut self, iface: &str) -> Result<(), BpfError> {
        match tc::qdisc_add_clsact(iface) {
            // Once per name: an interface re-created under it gets clsact again.
            Ok(()) if !self.added_clsact.iter().any(|i| i == iface) => self.added_clsact.push(iface.to_owned()),
            Ok(()) => {}
            Err(TcError::NetlinkError(e)) if e.raw_os_error() == Some(Errno::EEXIST as i32) => {}
            Err(source) => return Err(BpfError::Clsact { iface: iface.to_owned(), source }),
        }
        Ok(())
    }

    /// Takes the filter the caller put under clsact at `hook` of `iface` (at
    /// [`FILTER_PRIORITY`] and [`Hook::filter_handle`]; not a BPF program: the `act_mirred`
    /// redirect to an IFB device on kernels whose `bpf_redirect()` cannot feed one) as one of
    /// this datapath's attachments: detached on stop, forgotten with a gone interface, left
    /// in place on a handover, as the others.
    pub fn adopt_filter(&mut self, iface: &str, hook: Hook) -> Result<(), BpfError> {
        let handle = TcHandle::from(hook.filter_handle());
        let link = SchedClassifierLink::attached(iface, hook.attach_type(), FILTER_PRIORITY, handle, None)
            .map_err(|e| BpfError::Attach { iface: iface.to_owned(), hook, source: ProgramError::IOError(e) })?;
        self.links.push(Attached { iface: iface.to_owned(), hook, link, pin: None });
        Ok(())
    }

    /// Detaches from every interface (and removes the links' pins). Returns the interfaces
    /// whose clsact qdisc this process added, for the caller to remove (see
    /// [`crate::qdisc::delete_clsact`]).
    pub fn detach_all(&mut self) -> Result<Vec<String>, BpfError> {
        let mut first_err = None;
        for Attached { iface, link, pin, .. } in std::mem::take(&mut self.links) {
            if let Some(path) = pin {
                if let Err(e) = std::fs::remove_file(&path) {
                    first_err.get_or_insert(BpfError::Pin {
                        path,
                        action: "removing the link's pin",
                        source: Box::new(e),
                    });
                }
            }
            if let Err(source) = link.detach() {
                first_err.get_or_insert(BpfError::Detach { iface, source });
            }
        }
        let added = std::mem::take(&mut self.added_clsact);
        first_err.map_or(Ok(added), Err)
    }

    /// Leaves the program attached and the maps pinned when this process exits, for the next
    /// shaperd to take over (an upgrade): shaping goes on at the last rates meanwhile.
    pub fn leave_in_place(&mut self) {
        for attached in std::mem::take(&mut self.links) {
            if attached.pin.is_some() {
                // A TCX link lives on by its pin: dropping it only closes this process's fd.
                drop(attached.link);
            } else {
                // Dropping a netlink link would delete the filter.
                std::mem::forget(attached.link);
            }
        }
        self.added_clsact.clear();
    }

    /// Forgets the attachment to `iface` without detaching it: the interface is gone, and the
    /// attachment with it (or someone removed it). A TCX link's pin is removed, so that an
    /// interface that takes the name does not take the dead link over.
    pub fn forget(&mut self, iface: &str, hook: Hook) {
        for Attached { iface, link, pin, .. } in self.take_links(iface, hook) {
            if let Some(path) = pin {
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::warn!(interface = %iface, path = %path.display(), error = %e, "removing a dead link's pin");
                }
            }
            if Self::attach_mode() == AttachMode::Clsact {
                // Dropping it would delete a filter by the old index, which another interface
                // may have by now.
                std::mem::forget(link);
            } else {
                // Closing the fd frees a TCX link the kernel already took off the device.
                drop(link);
            }
        }
    }

    /// Detaches from the interface that was called `iface` when the program was attached
    /// (renamed since, and no longer shaped), removing its TCX link's pin. Failures are
    /// logged: the interface may be going away meanwhile.
    pub fn detach(&mut self, iface: &str, hook: Hook) {
        for Attached { iface, link, pin, .. } in self.take_links(iface, hook) {
            if let Some(path) = pin {
                if let Err(e) = std::fs::remove_file(&path) {
                    tracing::warn!(interface = %iface, path = %path.display(), error = %e, "removing the link's pin");
                }
            }
            if let Err(e) = link.detach() {
                tracing::warn!(interface = %iface, error = %e, "detaching");
            }
        }
    }

    /// The attachments to `iface` at `hook`, taken out of the bookkeeping.
    fn take_links(&mut self, iface: &str, hook: Hook) -> Vec<Attached> {
        let (taken, kept) =
            std::mem::take(&mut self.links).into_iter().partition(|a| a.iface == iface && a.hook == hook);
        self.links = kept;
        taken
    }

    /// Drops the record that this process added the clsact qdisc of `iface` (gone with the
    /// interface, or removed by the caller); returns whether there was one.
    pub fn forget_added_clsact(&mut self, iface: &str) -> bool {
        let before = self.added_clsact.len();
        self.added_clsact.retain(|i| i != iface);
        self.added_clsact.len() != before
    }

    /// Whether this program is attached at egress of `iface` by TCX (see
    /// [`Self::attach_mode`]; a clsact filter is listed with `crate::qdisc::has_egress_filter`).
    pub fn tcx_attached(&self, iface: &str, hook: Hook) -> Result<bool, BpfError> {
        let query_err = |source| BpfError::Query { iface: iface.to_owned(), source };
        let ours = self.program_at(hook).info().map_err(query_err)?.id();
        let (_, programs) = SchedClassifier::query_tcx(iface, hook.attach_type()).map_err(query_err)?;
        Ok(programs.iter().any(|p| p.id() == ours))
    }

    /// Removes the settings of interface `ifindex` (gone, or renamed away), so that an
    /// interface that gets the index later does not inherit them. None there is no error.
    pub fn remove_iface(&mut self, ifindex: u32) -> Result<(), BpfError> {
        remove_ifindex(&mut self.ifaces, maps::IFACES, ifindex)?;
        self.refresh_iface_slot(ifindex)
    }

    /// Makes the `IFACE_SLOTS` slot of interface `ifindex` a copy of the `IFACES` entry of the
    /// interface that holds it: the one that held it if it still has an entry, else the
    /// lowest index with an entry that may hold it, else none.
    fn refresh_iface_slot(&mut self, ifindex: u32) -> Result<(), BpfError> {
        let slot = iface_slot(ifindex);
        let held =
            self.iface_slots.get(&slot, 0).map_err(map_err(maps::IFACE_SLOTS, format!("reading slot {slot}")))?;
        let mut holder = None;
        for entry in &self.ifaces {
            let (index, config) = entry.map_err(map_err(maps::IFACES, "listing the interfaces"))?;
            if iface_slot(index) != slot {
                continue;
            }
            if index == held.ifindex {
                holder = Some((index, config));
                break;
            }
            if holder.is_none_or(|(lowest, _)| index < lowest) {
                holder = Some((index, config));
            }
        }
        let value = holder.map_or_else(IfaceSlot::default, |(ifindex, config)| IfaceSlot { ifindex, _pad: 0, config });
        self.iface_slots.set(slot, value, 0).map_err(map_err(maps::IFACE_SLOTS, format!("writing slot {slot}")))
    }

    /// Slot `slot` of `IFACE_SLOTS` (tests).
    pub fn iface_slot(&self, slot: u32) -> Result<IfaceSlot, BpfError> {
        self.iface_slots.get(&slot, 0).map_err(map_err(maps::IFACE_SLOTS, format!("reading slot {slot}")))
    }

    /// The interfaces whose clsact qdisc this process added (or took over the record of).
    #[must_use]
    pub fn added_clsact(&self) -> &[String] {
        &self.added_clsact
    }

    /// Takes the interfaces whose clsact qdisc an earlier shaperd added as added by this one,
    /// so that a stop after a takeover removes them as that one would have.
    pub fn assume_added_clsact(&mut self, ifaces: impl IntoIterator<Item = String>) {
        for iface in ifaces {
            if !self.added_clsact.contains(&iface) {
                self.added_clsact.push(iface);
            }
        }
    }

    /// The interfaces with a TCX link at `hook` pinned in this layout's pin directory or an
    /// older one's.
    #[must_use]
    pub fn pinned_links(&self, hook: Hook) -> Vec<String> {
        let mut names: Vec<String> = self
            .layout_dirs()
            .into_iter()
            .filter_map(|dir| std::fs::read_dir(dir).ok())
            .flatten()
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.strip_prefix(hook.pin_prefix()).map(str::to_owned))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Removes the attachment an earlier shaperd left on `iface`, which this one does not
    /// shape: its pinned TCX link (of any layout), or its filter at [`FILTER_PRIORITY`] /
    /// [`FILTER_HANDLE`] under clsact. Returns whether there was one.
    pub fn detach_left(&mut self, iface: &str, hook: Hook) -> Result<bool, BpfError> {
        let mut found = false;
        for dir in self.layout_dirs() {
            let path = dir.join(hook.pin_name(iface));
            if path.exists() {
                // Unpinned and closed, the link has no holder left: the kernel detaches it.
                let link = PinnedLink::from_pin(&path).map_err(pin_err(&path, "opening the pinned link"))?;
                drop(link.unpin().map_err(pin_err(&path, "removing the link's pin"))?);
                found = true;
            }
        }
        if Self::attach_mode() == AttachMode::Clsact {
            let handle = TcHandle::from(hook.filter_handle());
            if let Ok(link) = SchedClassifierLink::attached(iface, hook.attach_type(), FILTER_PRIORITY, handle, None) {
                link.detach().map_err(|source| BpfError::Detach { iface: iface.to_owned(), source })?;
                found = true;
            }
        }
        Ok(found)
    }

    /// Removes what earlier shaperds with other map layouts pinned beside this layout's
    /// directory (after [`Self::attach`] moved the links it found there): their maps go once
    /// no program uses them, and a link still pinned there is on an interface nobody shapes
    /// any more, which this detaches.
    pub fn retire_older_layouts(&mut self) -> Result<(), BpfError> {
        let Some(current) = self.pin_dir.clone() else { return Ok(()) };
        for dir in self.layout_dirs().into_iter().filter(|d| *d != current) {
            let entries = std::fs::read_dir(&dir).map_err(pin_err(&dir, "listing an older layout's pins"))?;
            for entry in entries {
                let path = entry.map_err(pin_err(&dir, "listing an older layout's pins"))?.path();
                std::fs::remove_file(&path).map_err(pin_err(&path, "removing an older layout's pin"))?;
            }
            std::fs::remove_dir(&dir).map_err(pin_err(&dir, "removing an older layout's pin directory"))?;
            tracing::info!(dir = %dir.display(), "removed the pins of an older map layout");
        }
        Ok(())
    }

    /// This layout's pin directory and those of other layouts beside it (`v<N>`).
    fn layout_dirs(&self) -> Vec<PathBuf> {
        let Some(current) = &self.pin_dir else { return Vec::new() };
        let Some(root) = current.parent() else { return vec![current.clone()] };
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
            .into_iter()
            .flatten()
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.is_dir()
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .and_then(|n| n.strip_prefix('v'))
                        .is_some_and(|v| v.parse::<u32>().is_ok())
            })
            .collect();
        dirs.sort();
        dirs
    }

    /// Where an older map layout pinned `iface`'s TCX link, if one did.
    fn older_link_pin(&self, iface: &str, hook: Hook) -> Option<PathBuf> {
        let current = self.pin_dir.as_ref()?;
        self.layout_dirs()
            .into_iter()
            .filter(|d| d != current)
            .map(|d| d.join(hook.pin_name(iface)))
            .find(|p| p.exists())
    }

    /// Removes the maps' pins (after [`Self::detach_all`]); the maps go when the last user
    /// lets go of them.
    pub fn unpin_maps(&mut self) -> Result<(), BpfError> {
        let Some(dir) = self.pin_dir.take() else { return Ok(()) };
        for name in maps::ALL {
            let path = dir.join(name);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(BpfError::Pin { path, action: "removing the map's pin", source: Box::new(e) }),
            }
        }
        std::fs::remove_dir(&dir).map_err(pin_err(&dir, "removing the pin directory"))?;
        if let Some(root) = dir.parent() {
            // The root is shared by nothing else of ours; leave it if anything is still in it.
            let _ = std::fs::remove_dir(root);
        }
        Ok(())
    }

    /// Interface names the program is attached to at `hook`.
    pub fn attached(&self, hook: Hook) -> impl Iterator<Item = &str> {
        self.links.iter().filter(move |a| a.hook == hook).map(|a| a.iface.as_str())
    }

    /// Marks interface `ifindex` as LAN side, for the ingress program to record its packets'
    /// origins (`flags`: `shaper_common::LAN_L3` or 0).
    pub fn set_lan_iface(&mut self, ifindex: u32, flags: u32) -> Result<(), BpfError> {
        self.lan_ifaces
            .insert(ifindex, flags, 0)
            .map_err(map_err(maps::LAN_IFACES, format!("setting ifindex {ifindex}")))
    }

    /// The recorded origins, by flow hash (see `shaper_common::Origin`).
    #[must_use]
    pub fn origins(&self) -> Vec<(u32, Origin)> {
        self.origins.iter().filter_map(Result::ok).collect()
    }

    /// Records `origin` under flow hash `hash`, as the LAN-ingress program does (for tests).
    pub fn set_origin(&mut self, hash: u32, origin: Origin) -> Result<(), BpfError> {
        self.origins.insert(hash, origin, 0).map_err(map_err(maps::ORIGINS, format!("setting hash {hash:#x}")))
    }

    /// Redirects the packets arriving on interface `ifindex` to the IFB device `ifb` (see
    /// [`Hook::IfbRedirect`]).
    pub fn set_ifb_target(&mut self, ifindex: u32, ifb: u32) -> Result<(), BpfError> {
        self.ifb_targets
            .insert(ifindex, ifb, 0)
            .map_err(map_err(maps::IFB_TARGETS, format!("setting ifindex {ifindex}")))
    }

    /// Stops redirecting interface `ifindex` (gone, or no longer configured). None there is
    /// no error.
    pub fn remove_ifb_target(&mut self, ifindex: u32) -> Result<(), BpfError> {
        remove_ifindex(&mut self.ifb_targets, maps::IFB_TARGETS, ifindex)
    }

    /// Removes interface `ifindex` from the LAN side (gone, or no longer configured). None
    /// there is no error.
    pub fn remove_lan_iface(&mut self, ifindex: u32) -> Result<(), BpfError> {
        remove_ifindex(&mut self.lan_ifaces, maps::LAN_IFACES, ifindex)
    }

    /// Sets an interface's slot, default class and overhead. Its `link_byte_ns` is worked
    /// out here from `link_bytes`, whatever the caller put there.
    pub fn set_iface(&mut self, ifindex: u32, config: IfaceConfig) -> Result<(), BpfError> {
        if self.journal.is_some() {
            let old = self.iface_config(ifindex)?;
            self.journal.get_or_insert_default().push(Undo::Iface(ifindex, old));
        }
        let config = config.with_byte_ns();
        self.ifaces.insert(ifindex, config, 0).map_err(map_err(maps::IFACES, format!("setting ifindex {ifindex}")))?;
        self.refresh_iface_slot(ifindex)
    }

    /// An interface's settings, if it has any.
    pub fn iface_config(&self, ifindex: u32) -> Result<Option<IfaceConfig>, BpfError> {
        match self.ifaces.get(&ifindex, 0) {
            Ok(config) => Ok(Some(config)),
            Err(MapError::KeyNotFound) => Ok(None),
            Err(source) => {
                Err(BpfError::Map { name: maps::IFACES, action: format!("reading ifindex {ifindex}"), source })
            }
        }
    }

    /// Runs `writes` as one change of the class and interface settings: if it fails, each
    /// entry it wrote with [`Self::set_class`] or [`Self::set_iface`] is written back as it
    /// was, newest first, and a rule set it switched to with [`Self::load_rules`] is switched
    /// back, so that the datapath goes on as before rather than half changed. Putting an
    /// entry back can itself fail only as the write did (a map the kernel refuses to
    /// update); that is logged, and the first error returned.
    pub fn all_or_nothing<T, E: From<BpfError>>(
        &mut self,
        writes: impl FnOnce(&mut Self) -> Result<T, E>,
    ) -> Result<T, E> {
        assert!(self.journal.is_none(), "all_or_nothing does not nest");
        self.journal = Some(Vec::new());
        let result = writes(self);
        let journal = self.journal.take().unwrap_or_default();
        if result.is_err() {
            for undo in journal.into_iter().rev() {
                let restored = match undo {
                    Undo::Class(class, old) => self.set_class(class, old),
                    Undo::Rules(old) => self.switch_rules(old, "switching back to the old rules"),
                    Undo::Iface(ifindex, Some(old)) => self.set_iface(ifindex, old),
                    Undo::Iface(ifindex, None) => self.remove_iface(ifindex),
                };
                if let Err(e) = restored {
                    tracing::error!(error = %e, "putting back a datapath entry after a failed change");
                }
            }
        }
        result
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
        // `ports` records the slots any of the three tables (ports, lengths) uses.
        let ids = compiled.sport_ids.iter().zip(&compiled.dport_ids).zip(&compiled.len_ids);
        for (port, ((&s, &d), &l)) in (0..PORT_SLOTS).zip(ids) {
            if s | d | l == 0 {
                continue;
            }
            if s != 0 {
                self.sport_ids.set(port_base + port, s, 0).map_err(map_err(maps::SPORT_IDS, format!("port {port}")))?;
            }
            if d != 0 {
                self.dport_ids.set(port_base + port, d, 0).map_err(map_err(maps::DPORT_IDS, format!("port {port}")))?;
            }
            if l != 0 {
                self.len_ids.set(port_base + port, l, 0).map_err(map_err(maps::LEN_IDS, format!("length {port}")))?;
            }
            ports.push(port);
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
        // The filter before the tuples that use it, and both before the switch: a key of
        // the bank always finds its bit set.
        let (filter_mask, filter) = rules::filter(keys.iter());
        let filter_base = bank * FILTER_WORDS;
        for (&word, &bits) in &filter {
            self.rule_filter
                .set(filter_base + word, bits, 0)
                .map_err(map_err(maps::RULE_FILTER, format!("word {word}")))?;
        }
        for (i, tuple) in compiled.tuples.iter().enumerate() {
            let i = bank * MAX_TUPLES + u32::try_from(i).expect("at most MAX_TUPLES");
            let tuple = Tuple { filter_mask, ..*tuple };
            self.tuples.set(i, tuple, 0).map_err(map_err(maps::TUPLES, format!("tuple {i}")))?;
        }
        // The bank's class-cache mask before the switch, as its tuples.
        let mut masks = self.cache_masks.get(&0, 0).map_err(map_err(maps::CACHE_MASKS, "reading the masks"))?;
        masks.banks[bank as usize] = cache_mask(&compiled.tuples);
        self.cache_masks.set(0, masks, 0).map_err(map_err(maps::CACHE_MASKS, format!("the mask of bank {bank}")))?;
        let count = u32::try_from(compiled.tuples.len()).expect("at most MAX_TUPLES");
        if self.journal.is_some() {
            let old = self.globals.get(&0, 0).map_err(map_err(maps::GLOBALS, "reading the active rules"))?;
            // The old bank is intact until the next rule set is written: switching back to
            // it undoes this one.
            self.journal.get_or_insert_default().push(Undo::Rules(old));
        }
        let flags = if compiled.tuples.iter().any(Tuple::per_packet) { RULES_PER_PACKET } else { 0 };
        // switch_rules keeps the datapath's epoch and moves the generation on.
        self.switch_rules(
            Globals { tuple_count: count, bank, flags, ..Globals::default() },
            "switching to the new rule bank",
        )?;
        self.banks[bank as usize] =
            BankContents { keys: Some(keys), ports: Some(ports), filter: Some(filter.into_keys().collect()) };
        Ok(())
    }

    /// Makes `rules` the active rule bank, in a new generation (the class cache's answers of
    /// every other one are stale), and in the epoch the datapath is in. The class cache is
    /// emptied first when the generation's low 16 bits, which its entries keep, come round
    /// to 0 (once in 65,536 switches): no entry is then as old as the generations it could
    /// pass for.
    fn switch_rules(&mut self, rules: Globals, doing: &'static str) -> Result<(), BpfError> {
        let old = self.globals.get(&0, 0).map_err(map_err(maps::GLOBALS, "reading the rules' generation"))?;
        let globals = Globals {
            generation: old.generation.wrapping_add(1),
            epoch: old.epoch,
            active_gen: old.active_gen,
            ..rules
        };
        if flow_cache_expires(globals.generation) {
            self.empty_class_cache()?;
        }
        self.globals.set(0, globals, 0).map_err(map_err(maps::GLOBALS, doing))
    }

    /// Empties the class cache: every slot 0.
    fn empty_class_cache(&mut self) -> Result<(), BpfError> {
        for set in 0..CACHE_SETS {
            self.class_cache
                .set(set, [0; CACHE_WAYS as usize], 0)
                .map_err(map_err(maps::CLASS_CACHE, format!("emptying set {set} of the class cache")))?;
        }
        Ok(())
    }

    /// The class cache's set `set` (tests): a `FlowEntry::word` a way, 0 if empty.
    pub fn class_cache_set(&self, set: u32) -> Result<[u64; CACHE_WAYS as usize], BpfError> {
        self.class_cache.get(&set, 0).map_err(map_err(maps::CLASS_CACHE, format!("reading set {set}")))
    }

    /// The ports with interval ids in each rule bank, if known: for the next process that
    /// takes the pinned maps over ([`Self::assume_bank_ports`]).
    #[must_use]
    pub fn bank_ports(&self) -> [Option<Vec<u32>>; 2] {
        [self.banks[0].ports.clone(), self.banks[1].ports.clone()]
    }

    /// Takes what an earlier process recorded with [`Self::bank_ports`] as the banks' ports,
    /// so that clearing a bank need not write all 65,536 ports of both tables.
    pub fn assume_bank_ports(&mut self, ports: [Option<Vec<u32>>; 2]) {
        for (bank, ports) in self.banks.iter_mut().zip(ports) {
            if bank.ports.is_none() {
                bank.ports = ports.filter(|p| p.iter().all(|&port| port < PORT_SLOTS));
            }
        }
    }

    /// Empties rule bank `bank`: the entries, port ids and filter words known to be there;
    /// the entries of an unknown bank are found by walking `RULES`, its ports and filter
    /// words are all cleared.
    fn clear_bank(&mut self, bank: u32) -> Result<(), BpfError> {
        let port_base = bank * PORT_SLOTS;
        let BankContents { keys, ports, filter } = std::mem::take(&mut self.banks[bank as usize]);
        let keys = keys.unwrap_or_else(|| {
            let range = bank * MAX_TUPLES..(bank + 1) * MAX_TUPLES;
            self.rules.keys().filter_map(Result::ok).filter(|k| range.contains(&u32::from(k.tuple))).collect()
        });
        let ports = ports.unwrap_or_else(|| (0..PORT_SLOTS).collect());
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
            self.len_ids.set(port_base + port, 0, 0).map_err(map_err(maps::LEN_IDS, format!("length {port}")))?;
        }
        let filter_base = bank * FILTER_WORDS;
        for word in filter.unwrap_or_else(|| (0..FILTER_WORDS).collect()) {
            self.rule_filter
                .set(filter_base + word, 0, 0)
                .map_err(map_err(maps::RULE_FILTER, format!("clearing word {word}")))?;
        }
        Ok(())
    }

    /// Sets a class's rate (bytes/s; 0 = unpaced) and drop horizon. Its `rate_byte_ns` and
    /// `share_byte_ns` are worked out here from its rates, whatever the caller put there.
    pub fn set_class(&mut self, class: u32, config: ClassConfig) -> Result<(), BpfError> {
        if class >= self.class_slots {
            return Err(BpfError::ClassId { id: class, slots: self.class_slots });
        }
        if self.journal.is_some() {
            let old = self.class_config(class)?;
            self.journal.get_or_insert_default().push(Undo::Class(class, old));
        }
        let config = config.with_byte_ns();
        self.class_config.set(class, config, 0).map_err(map_err(maps::CLASS_CONFIG, format!("class {class}")))
    }

    /// Zeroes a class's counters and pacing state (for a class id that is given up).
    pub fn reset_class(&mut self, class: u32) -> Result<(), BpfError> {
        if class >= self.class_slots {
            return Err(BpfError::ClassId { id: class, slots: self.class_slots });
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

    /// Starts a tick: returns the classes that counted a packet since the last call (see
    /// [`ActiveClasses`]) and clears their bits; then starts, in one write of `GLOBALS`, the
    /// next generation of marks (each CPU marks a class again with its first packet there)
    /// and the next epoch (the datapath counts each host of a class once per epoch:
    /// `ClassStats::hosts_near`, `hosts_over`), and returns the epoch that ended. A class whose
    /// only packets came between the read and the new generation is not marked again until it
    /// sends in the new one.
    pub fn start_tick(&mut self) -> Result<TickStart, BpfError> {
        let active = self.active.get(&0, 0).map_err(map_err(maps::ACTIVE, "reading the active classes"))?;
        self.active
            .set(0, ActiveClasses::default(), 0)
            .map_err(map_err(maps::ACTIVE, "clearing the active classes"))?;
        let mut globals =
            self.globals.get(&0, 0).map_err(map_err(maps::GLOBALS, "reading the generation and the epoch"))?;
        globals.active_gen = globals.active_gen.wrapping_add(1);
        let ended_epoch = globals.epoch;
        globals.epoch = globals.epoch.wrapping_add(1);
        self.globals.set(0, globals, 0).map_err(map_err(maps::GLOBALS, "starting a generation and an epoch"))?;
        Ok(TickStart { active, ended_epoch })
    }

    /// A class's counters, summed over CPUs.
    pub fn class_stats(&self, class: u32) -> Result<ClassStats, BpfError> {
        let per_cpu =
            self.class_stats.get(&class, 0).map_err(map_err(maps::CLASS_STATS, format!("reading class {class}")))?;
        Ok(per_cpu.iter().fold(ClassStats::default(), ClassStats::merge))
    }
}

/// What [`Datapath::start_tick`] found.
#[derive(Clone, Copy, Debug)]
pub struct TickStart {
    /// The classes that counted a packet since the last tick.
    pub active: ActiveClasses,
    /// The epoch that ended: its isolation counters (`IsolationCounters::epoch`) are complete.
    pub ended_epoch: u32,
}

impl Drop for Datapath {
    fn drop(&mut self) {
        if let Err(e) = self.detach_all() {
            tracing::warn!(error = %e, "detaching on drop");
        }
    }
}

/// Makes sure `root` is (or will be created) on a bpffs mount: mounts bpffs at `/sys/fs/bpf`
/// when `root` is below it and nothing is mounted there (systemd mounts it at boot; a minimal
/// system may not).
fn ensure_bpffs(root: &Path) -> Result<(), BpfError> {
    let mut existing = root;
    while !existing.exists() {
        existing = existing.parent().unwrap_or(Path::new("/"));
    }
    if fs_type(existing) == Some(BPF_FS_MAGIC) {
        return Ok(());
    }
    let sys_fs_bpf = Path::new("/sys/fs/bpf");
    if root.starts_with(sys_fs_bpf) && existing == sys_fs_bpf {
        return match mount(Some("bpf"), sys_fs_bpf, Some("bpf"), MsFlags::empty(), Some("mode=0700")) {
            Ok(()) => {
                tracing::info!("mounted bpffs at /sys/fs/bpf");
                Ok(())
            }
            Err(errno) => Err(BpfError::Pin {
                path: sys_fs_bpf.to_owned(),
                action: "mounting bpffs (mount -t bpf bpf /sys/fs/bpf)",
                source: Box::new(std::io::Error::from(errno)),
            }),
        };
    }
    Err(BpfError::Pin {
        path: root.to_owned(),
        action: "not on a bpf filesystem; pin under /sys/fs/bpf or mount bpffs there",
        source: Box::new(std::io::Error::from(std::io::ErrorKind::InvalidInput)),
    })
}

/// The filesystem type (`f_type`) of the mount `path` is on.
fn fs_type(path: &Path) -> Option<FsType> {
    statfs(path).ok().map(|st| st.filesystem_type())
}
