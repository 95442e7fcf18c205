//! A full map's units on the wire as columns ([`pb::UnitColumns`]): the same content as one
//! `UnitMapping` message per unit, without a string or a message per unit. Clusters and
//! classes travel as numbers (positions in the first part's clusters and fallbacks), prefixes
//! as an EDNS Client Subnet option encodes them, a placement of one whole share as one bit.
//! At 11 M units a part of 65,536 units is about 1.8 MB where the messages took 4.8 MB, and a
//! front end pushes it into its columns without parsing text.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Range;

use cdnmap_mapper::model::{ClassIdx, ClusterIdx, UnitIdx};
use cdnmap_proto::v1 as pb;
use ipnet::IpNet;

use crate::follow_error::{invalid, FollowError};
use crate::limits::{MAX_UNITS, MAX_UNIT_PREFIXES};
use crate::serving::{Builder, ServingMap, Sizes};

/// The ECS family numbers (RFC 7871, section 6; IANA address family numbers).
const FAMILY_V4: u8 = 1;
const FAMILY_V6: u8 = 2;

/// Units `units` of `m` as columns.
pub fn of(m: &ServingMap, units: Range<usize>) -> pb::UnitColumns {
    let start = units.start;
    let n = units.len();
    let mut c = pb::UnitColumns {
        id_lengths: Vec::with_capacity(n),
        classes: Vec::with_capacity(n),
        prefix_counts: Vec::with_capacity(n),
        placements: Vec::with_capacity(n),
        share_clusters: Vec::with_capacity(n),
        backups: Vec::with_capacity(2 * n),
        ..Default::default()
    };
    for u in units.map(|u| u as UnitIdx) {
        let id = m.unit_id(u);
        c.ids.extend_from_slice(id.as_bytes());
        c.id_lengths.push(id.len() as u32);
        c.classes.push(u32::from(m.unit_class(u)));
        let prefixes = m.unit_prefixes(u);
        c.prefix_counts.push(prefixes.len() as u32);
        for p in prefixes {
            put_prefix(&mut c.prefixes, &p);
        }
        let (clusters, shares) = m.shares(u);
        let whole = shares.len() == 1 && shares[0].to_bits() == 1f64.to_bits();
        c.placements
            .push((clusters.len() as u32) << 1 | u32::from(whole));
        c.share_clusters.extend_from_slice(clusters);
        if !whole {
            c.shares.extend_from_slice(shares);
        }
        let overflow = m.overflow(u);
        if overflow.to_bits() != 0 {
            c.overflow_units.push(u - start as UnitIdx);
            c.overflow_shares.push(overflow);
        }
        c.backups
            .extend(m.backups(u).map(|b| b.map_or(0, |c| c + 1)));
        if let Some((cluster, share)) = m.companion(u) {
            c.companion_units.push(u - start as UnitIdx);
            c.companion_clusters.push(cluster);
            c.companion_shares.push(share);
        }
    }
    c
}

/// The whole map's size as the first part announces it.
pub fn size_of(m: &ServingMap) -> pb::MapSize {
    let s = m.sizes();
    pb::MapSize {
        units: s.units as u64,
        id_bytes: s.id_bytes as u64,
        prefixes: s.prefixes as u64,
        shares: s.shares as u64,
    }
}

/// The room to make for a map announced as `size`: what it says, but no more than a map of
/// at most [`MAX_UNITS`] units of plausible sizes holds (a forged announcement cannot make a
/// front end reserve gigabytes; a map larger than announced grows as it comes).
pub fn room_for(size: &pb::MapSize) -> Sizes {
    let units = size.units.min(MAX_UNITS as u64) as usize;
    let per_unit = |total: u64, most: usize| total.min((units * most) as u64) as usize;
    Sizes {
        units,
        id_bytes: per_unit(size.id_bytes, 64),
        prefixes: per_unit(size.prefixes, 4),
        shares: per_unit(size.shares, 4),
    }
}

fn put_prefix(out: &mut Vec<u8>, p: &IpNet) {
    let len = p.prefix_len();
    let bytes = usize::from(len).div_ceil(8);
    match p.trunc() {
        IpNet::V4(n) => {
            out.extend_from_slice(&[FAMILY_V4, len]);
            out.extend_from_slice(&n.addr().octets()[..bytes]);
        }
        IpNet::V6(n) => {
            out.extend_from_slice(&[FAMILY_V6, len]);
            out.extend_from_slice(&n.addr().octets()[..bytes]);
        }
    }
}

/// The prefix at `bytes[*at..]`, `*at` moved past it.
fn take_prefix(bytes: &[u8], at: &mut usize) -> Result<IpNet, String> {
    let head = bytes
        .get(*at..*at + 2)
        .ok_or("cut short before a prefix's family and length")?;
    let (family, len) = (head[0], head[1]);
    let n = usize::from(len).div_ceil(8);
    let addr = bytes
        .get(*at + 2..*at + 2 + n)
        .ok_or("cut short inside a prefix's address")?;
    let ip = ecs_address(u16::from(family), len, addr)?;
    *at += 2 + n;
    IpNet::new(ip, len).map_err(|e| e.to_string())
}

/// The address of a prefix in the form of an EDNS Client Subnet option (RFC 7871, section
/// 6): `family` 1 (IPv4) or 2 (IPv6), the prefix length `source`, and exactly its first
/// ceil(source / 8) address bytes, the bits beyond `source` zero. The one reading of that
/// form: WatchMap's columns and the DNS front end's queries.
pub fn ecs_address(family: u16, source: u8, bytes: &[u8]) -> Result<IpAddr, String> {
    let max = match family {
        1 => 32,
        2 => 128,
        other => return Err(format!("family {other} is neither 1 (IPv4) nor 2 (IPv6)")),
    };
    if source > max {
        return Err(format!("a prefix length of {source} for family {family}"));
    }
    if bytes.len() != usize::from(source).div_ceil(8) {
        return Err(format!(
            "{} address bytes for a prefix length of {source}",
            bytes.len()
        ));
    }
    if let (Some(&last), used @ 1..) = (bytes.last(), source % 8) {
        if last & (0xff >> used) != 0 {
            return Err(format!(
                "address bits set beyond the prefix length {source}"
            ));
        }
    }
    let mut octets = [0u8; 16];
    octets[..bytes.len()].copy_from_slice(bytes);
    Ok(if family == 1 {
        IpAddr::V4(Ipv4Addr::new(octets[0], octets[1], octets[2], octets[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(octets))
    })
}

/// Appends the units of `c` to `b`. `class_of` maps a class number (a position in the first
/// part's fallbacks) to the class index; cluster numbers are cluster indices. Every column is
/// checked against the others and used up exactly; a unit is checked as [`Builder::push`]
/// checks it. On error some units may have been pushed: the caller drops the builder.
pub fn push(
    b: &mut Builder,
    class_of: &[ClassIdx],
    c: &pb::UnitColumns,
) -> Result<(), FollowError> {
    let n = check_lengths(b, c)?;
    // Room for this part's columns (grown by doubling when no exact reserve was made).
    b.grow(Sizes {
        units: n,
        id_bytes: c.ids.len(),
        prefixes: n,
        shares: c.share_clusters.len(),
    });
    let mut at = Cursor::default();
    let mut prefixes: Vec<IpNet> = Vec::new();
    for i in 0..n {
        push_unit(b, class_of, c, i, &mut at, &mut prefixes)?;
    }
    check_used_up(c, &at)
}

/// The number of units of `c`, after checking that the columns of one entry per unit agree,
/// that the overflow columns pair up, and that `b` has room for them.
fn check_lengths(b: &Builder, c: &pb::UnitColumns) -> Result<usize, FollowError> {
    let n = c.id_lengths.len();
    let per_unit = [
        ("classes", c.classes.len()),
        ("prefix_counts", c.prefix_counts.len()),
        ("placements", c.placements.len()),
    ];
    for (name, len) in per_unit {
        if len != n {
            return Err(invalid(
                format!("columns.{name}"),
                format!("{len} entries for {n} units"),
            ));
        }
    }
    if c.backups.len() != 2 * n {
        return Err(invalid(
            "columns.backups",
            format!("{} entries for {n} units (two each)", c.backups.len()),
        ));
    }
    let companions = [c.companion_clusters.len(), c.companion_shares.len()];
    if companions.iter().any(|&n| n != c.companion_units.len()) {
        return Err(invalid(
            "columns.companion_units",
            format!(
                "{} units for {} companion clusters and {} shares",
                c.companion_units.len(),
                companions[0],
                companions[1]
            ),
        ));
    }
    if c.overflow_units.len() != c.overflow_shares.len() {
        return Err(invalid(
            "columns.overflow_units",
            format!(
                "{} units for {} overflow shares",
                c.overflow_units.len(),
                c.overflow_shares.len()
            ),
        ));
    }
    let total = b.unit_count() + n;
    if total > MAX_UNITS {
        return Err(invalid(
            "columns",
            format!("{total} map units, at most {MAX_UNITS}"),
        ));
    }
    Ok(n)
}

/// How far each variable-length column has been read.
#[derive(Default)]
struct Cursor {
    ids: usize,
    prefixes: usize,
    share_clusters: usize,
    shares: usize,
    overflow_units: usize,
    companion_units: usize,
}

/// Reads unit `i` of `c` from the columns at `at` (moved past it) and pushes it to `b`;
/// `prefixes` is scratch space.
fn push_unit(
    b: &mut Builder,
    class_of: &[ClassIdx],
    c: &pb::UnitColumns,
    i: usize,
    at: &mut Cursor,
    prefixes: &mut Vec<IpNet>,
) -> Result<(), FollowError> {
    let len = c.id_lengths[i] as usize;
    let id = c
        .ids
        .get(at.ids..at.ids.saturating_add(len))
        .ok_or_else(|| invalid("columns.ids", format!("cut short at unit {i}")))
        .and_then(|bytes| {
            std::str::from_utf8(bytes)
                .map_err(|_| invalid("columns.ids", format!("unit {i}'s id is not UTF-8")))
        })?;
    at.ids += len;
    let field = |f: &str| format!("units[{id:?}].{f}");
    let class = class_of
        .get(c.classes[i] as usize)
        .copied()
        .ok_or_else(|| {
            invalid(
                field("traffic_class"),
                format!("class number {} of {}", c.classes[i], class_of.len()),
            )
        })?;
    let count = c.prefix_counts[i] as usize;
    if count > MAX_UNIT_PREFIXES {
        return Err(invalid(
            field("prefixes"),
            format!("{count} prefixes, at most {MAX_UNIT_PREFIXES}"),
        ));
    }
    prefixes.clear();
    for _ in 0..count {
        let p = take_prefix(&c.prefixes, &mut at.prefixes)
            .map_err(|e| invalid(field("prefixes"), e))?;
        prefixes.push(p);
    }
    let (clusters, values) = unit_shares(c, i, at, &field)?;
    let overflow = match c.overflow_units.get(at.overflow_units) {
        Some(&unit) if unit as usize == i => {
            at.overflow_units += 1;
            c.overflow_shares[at.overflow_units - 1]
        }
        _ => 0.0,
    };
    let backups = [c.backups[2 * i], c.backups[2 * i + 1]].map(|b| b.checked_sub(1));
    if let Some(&unit) = c.companion_units.get(at.companion_units) {
        if unit as usize == i {
            let k = at.companion_units;
            at.companion_units += 1;
            b.companion_of_next(c.companion_clusters[k], c.companion_shares[k]);
        }
    }
    b.push(
        id,
        class,
        prefixes.iter().copied(),
        clusters.iter().copied().zip(values.iter().copied()),
        overflow,
        backups,
    )?;
    Ok(())
}

/// Unit `i`'s shares: its clusters and their shares (one share of 1 when it is placed
/// whole), read at `at` (moved past them); `field` names the unit's fields in errors.
fn unit_shares<'c>(
    c: &'c pb::UnitColumns,
    i: usize,
    at: &mut Cursor,
    field: &dyn Fn(&str) -> String,
) -> Result<(&'c [ClusterIdx], &'c [f64]), FollowError> {
    let (k, whole) = ((c.placements[i] >> 1) as usize, c.placements[i] & 1 == 1);
    if k > MAX_UNIT_PREFIXES || (whole && k != 1) {
        return Err(invalid(
            field("shares"),
            format!("placement {} ({k} shares, whole: {whole})", c.placements[i]),
        ));
    }
    let clusters: &[ClusterIdx] = c
        .share_clusters
        .get(at.share_clusters..at.share_clusters + k)
        .ok_or_else(|| invalid(field("shares"), "cut short in columns.share_clusters"))?;
    at.share_clusters += k;
    let values: &[f64] = if whole {
        &[1.0]
    } else {
        let v = c
            .shares
            .get(at.shares..at.shares + k)
            .ok_or_else(|| invalid(field("shares"), "cut short in columns.shares"))?;
        at.shares += k;
        v
    };
    Ok((clusters, values))
}

/// Fails when a column has entries left after the last unit.
fn check_used_up(c: &pb::UnitColumns, at: &Cursor) -> Result<(), FollowError> {
    let left = [
        ("ids", at.ids, c.ids.len()),
        ("prefixes", at.prefixes, c.prefixes.len()),
        ("share_clusters", at.share_clusters, c.share_clusters.len()),
        ("shares", at.shares, c.shares.len()),
        ("overflow_units", at.overflow_units, c.overflow_units.len()),
        (
            "companion_units",
            at.companion_units,
            c.companion_units.len(),
        ),
    ];
    for (name, used, len) in left {
        if used != len {
            return Err(invalid(
                format!("columns.{name}"),
                format!(
                    "{} entries left after the last unit ({used} of {len} used)",
                    len - used
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_round_trip_in_ecs_form() {
        for text in [
            "0.0.0.0/0",
            "10.1.2.0/24",
            "10.1.2.3/32",
            "10.1.0.0/17",
            "::/0",
            "2001:db8::/32",
            "2001:db8:1:2::/64",
            "2001:db8::1/128",
            "2001:db8:8000::/33",
        ] {
            let p: IpNet = text.parse().expect("prefix");
            let mut bytes = Vec::new();
            put_prefix(&mut bytes, &p);
            let mut at = 0;
            assert_eq!(take_prefix(&bytes, &mut at), Ok(p), "{text}");
            assert_eq!(at, bytes.len(), "{text}");
        }
    }

    #[test]
    fn bad_prefixes_are_refused() {
        for (bytes, problem) in [
            (&[1u8][..], "cut short"),
            (&[1, 24, 10, 1][..], "cut short"),
            (&[3, 8, 10][..], "neither"),
            (&[1, 33, 1, 2, 3, 4, 5][..], "length of 33"),
            (&[1, 23, 10, 1, 3][..], "beyond the prefix length"),
        ] {
            let err = take_prefix(bytes, &mut 0).expect_err("bad");
            assert!(err.contains(problem), "{bytes:?}: {err}");
        }
        // As a DNS query's option carries it: exactly the bytes its length takes.
        for (bytes, ok) in [
            (&[10u8, 1][..], false),
            (&[10, 1, 2, 0][..], false),
            (&[10, 1, 2][..], true),
        ] {
            assert_eq!(ecs_address(1, 24, bytes).is_ok(), ok, "{bytes:?}");
        }
        assert_eq!(
            ecs_address(1, 0, &[]),
            Ok("0.0.0.0".parse().expect("address"))
        );
    }
}
