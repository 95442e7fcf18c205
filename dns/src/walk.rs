//! Walking a DNS message's bytes to its OPT record's options, each step bounded by the
//! message's length: what the fast path (`crate::wire`) and the cookie check before the
//! answer (`crate::cookie`, for response rate limiting) read of a query.

/// The big-endian `u16` at `at` of `b`, if it is there.
pub(crate) fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The OPT record's type.
const TYPE_OPT: u16 = 41;

/// Calls `f` with the code and data of each option of `raw`'s OPT record, in order; `None`
/// when the message cannot be walked to its end.
pub(crate) fn each_option<'a>(raw: &'a [u8], mut f: impl FnMut(u16, &'a [u8])) -> Option<()> {
    let count = |i: usize| u16_at(raw, 4 + 2 * i).map(usize::from);
    let (questions, records) = (count(0)?, count(1)? + count(2)? + count(3)?);
    let mut at = 12;
    for _ in 0..questions {
        at = skip_name(raw, at)? + 4;
    }
    for _ in 0..records {
        at = skip_name(raw, at)?;
        let rtype = u16_at(raw, at)?;
        let rdlen = usize::from(u16_at(raw, at + 8)?);
        let rdata = raw.get(at + 10..at + 10 + rdlen)?;
        at += 10 + rdlen;
        if rtype != TYPE_OPT {
            continue;
        }
        let mut i = 0;
        while i + 4 <= rdata.len() {
            let (code, len) = (u16_at(rdata, i)?, usize::from(u16_at(rdata, i + 2)?));
            f(code, rdata.get(i + 4..i + 4 + len)?);
            i += 4 + len;
        }
    }
    Some(())
}

/// The position after the name at `at` (its labels, up to the root or a compression
/// pointer); `None` past the message's end or on a label type that is not one.
fn skip_name(raw: &[u8], mut at: usize) -> Option<usize> {
    // A name has at most 127 labels (255 bytes).
    for _ in 0..128 {
        let len = *raw.get(at)?;
        match len & 0xC0 {
            0xC0 => return Some(at + 2),
            0 if len == 0 => return Some(at + 1),
            0 => at += 1 + usize::from(len),
            _ => return None,
        }
    }
    None
}
