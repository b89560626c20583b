//! The few facts the `tp_btf` block programs need from the kernel's BTF:
//! where `struct request` keeps its queue, disk, sector and flags, the bit
//! numbers of the request flags, and the type of `block_rq_complete`'s
//! error argument.
//!
//! Written here rather than taken from `aya::Btf`: aya keeps every type of
//! the kernel in memory at once (about 19 MB for a 5.5 MB vmlinux, the
//! agent's start-up peak) and does not expose struct members. This reads
//! the raw bytes once, keeps one offset per type, and answers by name.

use std::collections::HashSet;
use std::path::Path;

use health_common::{bio, file, rq};

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;

// BTF kinds (uapi linux/btf.h).
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
pub(crate) const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
pub(crate) const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("not BTF data (magic {0:#06x})")]
    Magic(u16),
    #[error("truncated BTF: {0}")]
    Truncated(&'static str),
    #[error("unknown BTF kind {kind} (type {id})")]
    UnknownKind { kind: u32, id: u32 },
    #[error("{0} not in the kernel's BTF")]
    Missing(String),
}

/// The kernel's BTF, indexed by type id.
pub struct KernelBtf {
    data: Vec<u8>,
    types_at: usize,
    strings_at: usize,
    strings_len: usize,
    /// Byte offset of each type's header, from `types_at`; index = id - 1.
    offsets: Vec<u32>,
}

/// One type's header and the bytes of its members.
struct Ty<'a> {
    name_off: u32,
    kind: u32,
    kind_flag: bool,
    vlen: usize,
    size_or_type: u32,
    rest: &'a [u8],
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

impl KernelBtf {
    pub fn read(path: &Path) -> Result<Self, String> {
        let data = std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        Self::parse(data).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(data: Vec<u8>) -> Result<Self, BtfError> {
        let head = data
            .get(..HEADER_LEN)
            .ok_or(BtfError::Truncated("header"))?;
        let magic = u16::from_le_bytes([head[0], head[1]]);
        if magic != MAGIC {
            return Err(BtfError::Magic(magic));
        }
        let field = |i: usize| u32_at(head, 4 + 4 * i).unwrap_or(0) as usize;
        let (hdr_len, type_off, type_len, str_off, str_len) =
            (field(0), field(1), field(2), field(3), field(4));
        let types_at = hdr_len + type_off;
        let strings_at = hdr_len + str_off;
        if data.len() < types_at + type_len || data.len() < strings_at + str_len {
            return Err(BtfError::Truncated("sections"));
        }
        let mut offsets = Vec::new();
        let mut at = 0;
        while at < type_len {
            offsets.push(at as u32);
            let id = offsets.len() as u32;
            let b = &data[types_at + at..types_at + type_len];
            let info = u32_at(b, 4).ok_or(BtfError::Truncated("type"))?;
            let vlen = (info & 0xffff) as usize;
            let extra = match (info >> 24) & 0x1f {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                KIND_PTR | 7 | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
                | KIND_FUNC | 16 | KIND_TYPE_TAG => 0,
                kind => return Err(BtfError::UnknownKind { kind, id }),
            };
            at += 12 + extra;
        }
        if at != type_len {
            return Err(BtfError::Truncated("last type"));
        }
        Ok(Self {
            data,
            types_at,
            strings_at,
            strings_len: str_len,
            offsets,
        })
    }

    fn ty(&self, id: u32) -> Option<Ty<'_>> {
        let at = self.types_at + *self.offsets.get((id as usize).checked_sub(1)?)? as usize;
        let b = &self.data[at..];
        let info = u32_at(b, 4)?;
        Some(Ty {
            name_off: u32_at(b, 0)?,
            kind: (info >> 24) & 0x1f,
            kind_flag: info >> 31 == 1,
            vlen: (info & 0xffff) as usize,
            size_or_type: u32_at(b, 8)?,
            rest: &b[12..],
        })
    }

    fn name(&self, off: u32) -> &str {
        let off = off as usize;
        if off >= self.strings_len {
            return "";
        }
        let s = &self.data[self.strings_at + off..self.strings_at + self.strings_len];
        let end = s.iter().position(|&c| c == 0).unwrap_or(s.len());
        std::str::from_utf8(&s[..end]).unwrap_or("")
    }

    /// Whether the string at `off` is `name`: [`Self::name`] compared,
    /// without finding its end or checking its UTF-8 first. Lookups by name
    /// go through every type of the kernel's BTF (over 100,000), and decoding
    /// each name was 28 % of the agent's start (docs/benchmarks.md, "CI").
    fn name_is(&self, off: u32, name: &str) -> bool {
        let off = off as usize;
        if off >= self.strings_len {
            return name.is_empty();
        }
        let s = &self.data[self.strings_at + off..self.strings_at + self.strings_len];
        s.starts_with(name.as_bytes()) && s.get(name.len()).is_none_or(|&c| c == 0)
    }

    /// The id of the first type of `kind` named `name`.
    pub(crate) fn find(&self, kind: u32, name: &str) -> Option<u32> {
        (1..=self.offsets.len() as u32).find(|&id| {
            self.ty(id)
                .is_some_and(|t| t.kind == kind && self.name_is(t.name_off, name))
        })
    }

    /// Byte offset of `member` in `struct name` (members of anonymous
    /// structs and unions inside it included).
    pub fn member_offset(&self, name: &str, member: &str) -> Option<u32> {
        let id = self.find(KIND_STRUCT, name)?;
        self.member_in(id, member, 0, &mut HashSet::new())
    }

    /// `visited`: the anonymous types already searched in this lookup. Each
    /// is searched once, so a lookup costs at most every member of the blob
    /// once, whatever the nesting (a damaged blob can nest a struct in
    /// itself any number of times; the depth bound alone allowed vlen^5
    /// steps).
    fn member_in(
        &self,
        id: u32,
        member: &str,
        depth: u32,
        visited: &mut HashSet<u32>,
    ) -> Option<u32> {
        let t = self.ty(id)?;
        if !matches!(t.kind, KIND_STRUCT | KIND_UNION) || depth > 4 || !visited.insert(id) {
            return None;
        }
        (0..t.vlen).find_map(|i| {
            let m = &t.rest[12 * i..12 * i + 12];
            let (name_off, type_id, raw) = (u32_at(m, 0)?, u32_at(m, 4)?, u32_at(m, 8)?);
            // With kind_flag the low 24 bits are the offset, the rest a
            // bitfield size; the members read here are never bitfields.
            let bits = if t.kind_flag { raw & 0xff_ffff } else { raw };
            let name = self.name(name_off);
            if name == member {
                return Some(bits / 8);
            }
            if name.is_empty() {
                let inner = self.skip_modifiers(type_id);
                return self
                    .member_in(inner, member, depth + 1, visited)
                    .map(|o| o.saturating_add(bits / 8));
            }
            None
        })
    }

    fn skip_modifiers(&self, mut id: u32) -> u32 {
        for _ in 0..16 {
            match self.ty(id) {
                Some(t)
                    if matches!(
                        t.kind,
                        KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG
                    ) =>
                {
                    id = t.size_or_type
                }
                _ => break,
            }
        }
        id
    }

    /// The value of the enumerator `name` in any enum.
    pub fn enum_value(&self, name: &str) -> Option<i64> {
        (1..=self.offsets.len() as u32).find_map(|id| {
            let t = self.ty(id)?;
            let width = match t.kind {
                KIND_ENUM => 8,
                KIND_ENUM64 => 12,
                _ => return None,
            };
            (0..t.vlen).find_map(|i| {
                let e = &t.rest[width * i..width * i + width];
                if !self.name_is(u32_at(e, 0)?, name) {
                    return None;
                }
                let lo = u32_at(e, 4)?;
                Some(if width == 12 {
                    (u64::from(u32_at(e, 8)?) << 32 | u64::from(lo)) as i64
                } else {
                    i64::from(lo as i32)
                })
            })
        })
    }

    /// The name of the type of a raw tracepoint's argument `n` (0-based,
    /// after the hidden `void *` the kernel passes first), as written in
    /// the kernel source: the outermost typedef, or the base type.
    pub fn tracepoint_arg_type(&self, tracepoint: &str, n: usize) -> Option<String> {
        let typedef = self.find(KIND_TYPEDEF, &format!("btf_trace_{tracepoint}"))?;
        let ptr = self.ty(self.ty(typedef)?.size_or_type)?;
        let proto = self.ty(ptr.size_or_type)?;
        if ptr.kind != KIND_PTR || proto.kind != KIND_FUNC_PROTO || n + 1 >= proto.vlen {
            return None;
        }
        let param = &proto.rest[8 * (n + 1)..8 * (n + 2)];
        let arg = self.ty(u32_at(param, 4)?)?;
        Some(self.name(arg.name_off).to_string())
    }

    /// How many arguments a raw tracepoint passes (the hidden `void *`
    /// not counted).
    pub fn tracepoint_arg_count(&self, tracepoint: &str) -> Option<usize> {
        let typedef = self.find(KIND_TYPEDEF, &format!("btf_trace_{tracepoint}"))?;
        let ptr = self.ty(self.ty(typedef)?.size_or_type)?;
        let proto = self.ty(ptr.size_or_type)?;
        if ptr.kind != KIND_PTR || proto.kind != KIND_FUNC_PROTO || proto.vlen == 0 {
            return None;
        }
        Some(proto.vlen - 1)
    }

    /// A BTF image in which each of `names` (kind, name) found here has its
    /// kernel type id and every other id up to the last of them is an empty
    /// placeholder; `None` when none is found. For loaders that look targets
    /// up by name and need nothing else.
    pub fn sparse_image(&self, names: &[(u32, &str)]) -> Option<Vec<u8>> {
        let found: Vec<(u32, u32, &str)> = names
            .iter()
            .filter_map(|&(kind, name)| Some((self.find(kind, name)?, kind, name)))
            .collect();
        let last = found.iter().map(|f| f.0).max()?;
        let mut strings = vec![0u8];
        let mut types = Vec::with_capacity(12 * last as usize);
        for id in 1..=last {
            let (name_off, info) = match found.iter().find(|f| f.0 == id) {
                Some(&(_, kind, name)) => {
                    let off = strings.len() as u32;
                    strings.extend(name.as_bytes());
                    strings.push(0);
                    (off, kind << 24)
                }
                // An anonymous `void *`: the smallest type there is.
                None => (0, KIND_PTR << 24),
            };
            for v in [name_off, info, 0] {
                types.extend(v.to_le_bytes());
            }
        }
        let mut out = Vec::with_capacity(HEADER_LEN + types.len() + strings.len());
        out.extend(MAGIC.to_le_bytes());
        out.extend([1u8, 0]);
        let type_len = types.len() as u32;
        for v in [
            HEADER_LEN as u32,
            0,
            type_len,
            type_len,
            strings.len() as u32,
        ] {
            out.extend(v.to_le_bytes());
        }
        out.extend(types);
        out.extend(strings);
        Some(out)
    }

    /// Whether the kernel has a BTF raw tracepoint of this name.
    pub fn has_tracepoint(&self, tracepoint: &str) -> bool {
        self.find(KIND_TYPEDEF, &format!("btf_trace_{tracepoint}"))
            .is_some()
    }
}

/// Fills the `RQ_LAYOUT` slots from the kernel's BTF, or says what is
/// missing.
pub fn request_layout(btf: &KernelBtf) -> Result<[u32; rq::COUNT], BtfError> {
    let mut layout = [rq::ABSENT; rq::COUNT];
    let need = |s: &str, m: &str| {
        btf.member_offset(s, m)
            .ok_or_else(|| BtfError::Missing(format!("struct {s}.{m}")))
    };
    layout[rq::Q] = need("request", "q")?;
    layout[rq::SECTOR] = need("request", "__sector")?;
    layout[rq::CMD_FLAGS] = need("request", "cmd_flags")?;
    layout[rq::DISK_MAJOR] = need("gendisk", "major")?;
    layout[rq::DISK_FIRST_MINOR] = need("gendisk", "first_minor")?;
    // Optional: without it the disks' names are not recorded (DISK_NAMES).
    if let Some(off) = btf.member_offset("gendisk", "disk_name") {
        layout[rq::DISK_NAME] = off;
    }
    // Optional (Linux 5.15+): without it errors carry no disk identity,
    // and a reused device number cannot be told from the one before.
    if let Some(off) = btf.member_offset("gendisk", "diskseq") {
        layout[rq::DISK_SEQ] = off;
    }
    // The disk moved from the request to its queue in 5.16-5.19.
    match btf.member_offset("request", "rq_disk") {
        Some(off) => layout[rq::RQ_DISK] = off,
        None => layout[rq::Q_DISK] = need("request_queue", "disk")?,
    }
    for (slot, name) in [
        (rq::BIT_PREFLUSH, "__REQ_PREFLUSH"),
        (rq::BIT_FUA, "__REQ_FUA"),
        (rq::BIT_RAHEAD, "__REQ_RAHEAD"),
        (rq::BIT_SYNC, "__REQ_SYNC"),
        (rq::BIT_META, "__REQ_META"),
    ] {
        let bit = btf
            .enum_value(name)
            .filter(|b| (0..32).contains(b))
            .ok_or_else(|| BtfError::Missing(format!("enum req_flag_bits {name}")))?;
        layout[slot] = bit as u32;
    }
    layout[rq::COMPLETE_ARG_ERRNO] =
        u32::from(btf.tracepoint_arg_type("block_rq_complete", 1).as_deref() == Some("int"));
    // Only for `--early-block-errors`, and only all four or none: kernels
    // that `#define` the request flags have no bit number to read here.
    let early = (|| {
        let quiet = btf
            .enum_value("__RQF_QUIET")
            .filter(|b| (0..32).contains(b))?;
        Some([
            btf.member_offset("request", "rq_flags")?,
            btf.member_offset("request", "bio")?,
            btf.member_offset("gendisk", "state")?,
            quiet as u32,
        ])
    })();
    if let Some([flags, bio, state, quiet]) = early {
        layout[rq::RQ_FLAGS] = flags;
        layout[rq::RQ_BIO] = bio;
        layout[rq::DISK_STATE] = state;
        layout[rq::BIT_RQF_QUIET] = quiet;
    }
    Ok(layout)
}

/// Fills the `BIO_LAYOUT` slots from the kernel's BTF (with
/// [`bio::ENABLED`] set), or says what is missing.
pub fn bio_layout(btf: &KernelBtf) -> Result<[u32; bio::COUNT], BtfError> {
    let mut layout = [rq::ABSENT; bio::COUNT];
    let need = |s: &str, m: &str| {
        btf.member_offset(s, m)
            .ok_or_else(|| BtfError::Missing(format!("struct {s}.{m}")))
    };
    // The bio is the last argument of both: (q, bio) or (bio).
    let last = |tp: &str| {
        btf.tracepoint_arg_count(tp)
            .filter(|n| (1..=2).contains(n))
            .map(|n| n as u32 - 1)
            .ok_or_else(|| BtfError::Missing(format!("raw tracepoint {tp}(.., struct bio *)")))
    };
    layout[bio::QUEUE_ARG] = last("block_bio_queue")?;
    layout[bio::COMPLETE_ARG] = last("block_bio_complete")?;
    if layout[bio::COMPLETE_ARG] != 1 {
        return Err(BtfError::Missing(
            "raw tracepoint block_bio_complete(q, bio)".into(),
        ));
    }
    layout[bio::OPF] = need("bio", "bi_opf")?;
    layout[bio::FLAGS] = need("bio", "bi_flags")?;
    layout[bio::BIT_TRACE_COMPLETION] =
        btf.enum_value("BIO_TRACE_COMPLETION")
            .filter(|b| (0..16).contains(b))
            .ok_or_else(|| BtfError::Missing("enum BIO_TRACE_COMPLETION".into()))? as u32;
    match btf.member_offset("bio", "bi_bdev") {
        Some(off) => {
            layout[bio::BDEV] = off;
            layout[bio::BD_DEV] = need("block_device", "bd_dev")?;
        }
        None => {
            layout[bio::DISK] = need("bio", "bi_disk")?;
            layout[bio::DISK_MAJOR] = need("gendisk", "major")?;
            layout[bio::DISK_FIRST_MINOR] = need("gendisk", "first_minor")?;
            layout[bio::SECTOR] = need("bio", "bi_iter")? + need("bvec_iter", "bi_sector")?;
        }
    }
    layout[bio::RQ_BIO] = need("request", "bio")?;
    layout[bio::BI_NEXT] = need("bio", "bi_next")?;
    layout[bio::BI_SIZE] = need("bio", "bi_iter")? + need("bvec_iter", "bi_size")?;
    if btf.tracepoint_arg_count("block_rq_complete") != Some(3) {
        return Err(BtfError::Missing(
            "raw tracepoint block_rq_complete(rq, error, nr_bytes)".into(),
        ));
    }
    // Whose I/O: optional, a kernel without `CONFIG_BLK_CGROUP` still has
    // stalls, named without the cgroup.
    let chain = [
        btf.member_offset("bio", "bi_blkg"),
        btf.member_offset("blkcg_gq", "blkcg"),
        btf.member_offset("blkcg", "css")
            .zip(btf.member_offset("cgroup_subsys_state", "cgroup"))
            .map(|(css, cgroup)| css + cgroup),
        btf.member_offset("cgroup", "kn"),
        btf.member_offset("kernfs_node", "id"),
    ];
    if chain.iter().all(Option::is_some) {
        let slots = [
            bio::BLKG,
            bio::BLKG_BLKCG,
            bio::BLKCG_CGROUP,
            bio::CGROUP_KN,
            bio::KN_ID,
        ];
        for (slot, off) in slots.into_iter().zip(chain) {
            layout[slot] = off.unwrap_or(rq::ABSENT);
        }
    }
    layout[bio::ENABLED] = 1;
    Ok(layout)
}

/// Fills the `FILE_LAYOUT` slots of the returned-error programs: a file's
/// inode, its filesystem's device, and for block device nodes the device.
pub fn file_layout(btf: &KernelBtf) -> Result<[u32; file::COUNT], BtfError> {
    let need = |s: &str, m: &str| {
        btf.member_offset(s, m)
            .ok_or_else(|| BtfError::Missing(format!("struct {s}.{m}")))
    };
    let mut layout = [rq::ABSENT; file::COUNT];
    layout[file::F_INODE] = need("file", "f_inode")?;
    layout[file::I_SB] = need("inode", "i_sb")?;
    layout[file::S_DEV] = need("super_block", "s_dev")?;
    layout[file::I_INO] = need("inode", "i_ino")?;
    layout[file::I_MODE] = need("inode", "i_mode")?;
    layout[file::I_RDEV] = need("inode", "i_rdev")?;
    Ok(layout)
}

/// Whether `layout` lets the `block_rq_complete` program count what
/// `block_rq_error` would (`--early-block-errors`).
pub fn counts_early(layout: &[u32; rq::COUNT]) -> bool {
    [rq::RQ_FLAGS, rq::RQ_BIO, rq::DISK_STATE, rq::BIT_RQF_QUIET]
        .iter()
        .all(|&slot| layout[slot] != rq::ABSENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A little BTF image: `int`, `struct s { int a; union { int b; }; }`,
    /// `enum e { X = 3, Y = -1 }`, and a raw tracepoint typedef.
    fn sample() -> Vec<u8> {
        let strings = b"\0int\0s\0a\0b\0e\0X\0Y\0btf_trace_t\0".to_vec();
        let name = |n: &str| {
            let pos = strings
                .windows(n.len() + 2)
                .position(|w| w[0] == 0 && &w[1..=n.len()] == n.as_bytes() && w[n.len() + 1] == 0)
                .unwrap();
            (pos + 1) as u32
        };
        let mut t: Vec<u32> = Vec::new();
        let info = |kind: u32, vlen: u32, flag: u32| flag << 31 | kind << 24 | vlen;
        // 1: int
        t.extend([name("int"), info(KIND_INT, 0, 0), 4, 32]);
        // 2: anonymous union { int b; } at bit 32 of s
        t.extend([0, info(KIND_UNION, 1, 0), 4, name("b"), 1, 0]);
        // 3: struct s { int a; <2> at 32 bits } with kind_flag encoding
        t.extend([name("s"), info(KIND_STRUCT, 2, 1), 8]);
        t.extend([name("a"), 1, 0, 0, 2, 32]);
        // 4: enum e
        t.extend([
            name("e"),
            info(KIND_ENUM, 2, 0),
            4,
            name("X"),
            3,
            name("Y"),
            u32::MAX,
        ]);
        // 5: func proto (void *, int), 6: ptr to 5, 7: typedef btf_trace_t
        t.extend([0, info(KIND_FUNC_PROTO, 2, 0), 0, 0, 6, 0, 1]);
        t.extend([0, info(KIND_PTR, 0, 0), 5]);
        t.extend([name("btf_trace_t"), info(KIND_TYPEDEF, 0, 0), 6]);
        image(&t, &strings)
    }

    /// A BTF blob: the header, `types` (as little-endian words), `strings`.
    fn image(types: &[u32], strings: &[u8]) -> Vec<u8> {
        let types: Vec<u8> = types.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = Vec::new();
        out.extend(MAGIC.to_le_bytes());
        out.extend([1u8, 0]);
        for v in [HEADER_LEN as u32, 0, types.len() as u32, types.len() as u32] {
            out.extend(v.to_le_bytes());
        }
        out.extend((strings.len() as u32).to_le_bytes());
        out.extend(types);
        out.extend(strings);
        out
    }

    #[test]
    fn members_enums_and_tracepoint_arguments() {
        let btf = KernelBtf::parse(sample()).unwrap();
        assert_eq!(btf.member_offset("s", "a"), Some(0));
        assert_eq!(btf.member_offset("s", "b"), Some(4));
        assert_eq!(btf.member_offset("s", "c"), None);
        assert_eq!(btf.enum_value("X"), Some(3));
        assert_eq!(btf.enum_value("Y"), Some(-1));
        assert_eq!(btf.enum_value("Z"), None);
        assert_eq!(btf.tracepoint_arg_type("t", 0).as_deref(), Some("int"));
        assert_eq!(btf.tracepoint_arg_type("t", 1), None);
        assert_eq!(btf.tracepoint_arg_count("t"), Some(1));
        assert_eq!(btf.tracepoint_arg_count("u"), None);
        assert!(btf.has_tracepoint("t") && !btf.has_tracepoint("u"));
        // The sparse image keeps the typedef's id (7) and nothing else.
        let image = btf.sparse_image(&[(KIND_TYPEDEF, "btf_trace_t"), (KIND_FUNC, "nope")]);
        let sparse = KernelBtf::parse(image.unwrap()).unwrap();
        assert_eq!(sparse.find(KIND_TYPEDEF, "btf_trace_t"), Some(7));
        assert_eq!(sparse.offsets.len(), 7);
        assert_eq!(sparse.find(KIND_STRUCT, "s"), None);
        assert!(btf.sparse_image(&[(KIND_FUNC, "nope")]).is_none());
    }

    /// Names match whole: neither a prefix nor a longer name, and `name_is`
    /// agrees with `name` at every offset of the string section.
    #[test]
    fn names_match_whole() {
        let btf = KernelBtf::parse(sample()).unwrap();
        assert_eq!(btf.find(KIND_INT, "int"), Some(1));
        assert_eq!(btf.find(KIND_INT, "in"), None);
        assert_eq!(btf.find(KIND_INT, "int8"), None);
        assert_eq!(btf.find(KIND_TYPEDEF, "btf_trace_t"), Some(7));
        assert_eq!(btf.find(KIND_TYPEDEF, "btf_trace_"), None);
        assert_eq!(btf.enum_value("XY"), None);
        for off in 0..=btf.strings_len as u32 + 1 {
            let name = btf.name(off);
            assert!(btf.name_is(off, name), "{off}: {name:?}");
            assert!(!btf.name_is(off, &format!("{name}x")), "{off}: {name:?}");
        }
    }

    #[test]
    fn damaged_data_is_refused() {
        assert_eq!(
            KernelBtf::parse(vec![0; 8]).err(),
            Some(BtfError::Truncated("header"))
        );
        let mut bad = sample();
        bad[0] = 0;
        assert!(matches!(KernelBtf::parse(bad), Err(BtfError::Magic(_))));
        let mut cut = sample();
        cut.truncate(cut.len() - 20);
        assert_eq!(
            KernelBtf::parse(cut).err(),
            Some(BtfError::Truncated("sections"))
        );
    }

    /// A struct whose anonymous members all lead back to itself. Before each
    /// lookup visited a type once, `member_offset` walked every path through
    /// them down to the depth bound: 100^5 steps for this 1.2 KB blob.
    #[test]
    fn self_nested_anonymous_members_are_searched_once() {
        let members = 100u32;
        let mut t: Vec<u32> = vec![1, KIND_STRUCT << 24 | members, 8];
        for _ in 0..members {
            t.extend([0, 1, 0]);
        }
        let btf = KernelBtf::parse(image(&t, b"\0request\0")).unwrap();
        assert_eq!(btf.member_offset("request", "q"), None);
        assert_eq!(
            request_layout(&btf),
            Err(BtfError::Missing("struct request.q".into()))
        );
    }

    /// Every query on whatever parses, never a panic or a read out of bounds.
    fn query_everything(btf: &KernelBtf) {
        let _ = request_layout(btf);
        let _ = bio_layout(btf);
        let _ = btf.member_offset("s", "b");
        let _ = btf.enum_value("Y");
        let _ = btf.tracepoint_arg_type("t", 0);
        if let Some(image) = btf.sparse_image(&[(KIND_TYPEDEF, "btf_trace_t")]) {
            KernelBtf::parse(image).expect("a sparse image parses");
        }
    }

    proptest::proptest! {
        /// Random bytes behind a valid header are refused or parsed, and
        /// whatever parses answers every query.
        #[test]
        fn arbitrary_bytes_never_panic(tail in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let mut data = sample()[..HEADER_LEN].to_vec();
            data.extend(&tail);
            if let Ok(btf) = KernelBtf::parse(data) {
                query_everything(&btf);
            }
        }

        /// A valid image with one byte changed and cut short anywhere.
        #[test]
        fn damaged_images_never_panic(at in 0usize..400, byte in proptest::num::u8::ANY, cut in 0usize..400) {
            let mut data = sample();
            let len = data.len();
            data[at % len] = byte;
            data.truncate(len - cut % len);
            if let Ok(btf) = KernelBtf::parse(data) {
                query_everything(&btf);
            }
        }
    }
}
