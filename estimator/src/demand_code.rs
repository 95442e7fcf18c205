//! A demand in 16 bits: what the estimator rounds each forecast to (up, [`round_up`]) before it
//! reaches a round's instance, so that the store keeps the round's demands in two bytes a map
//! unit, exactly.
//!
//! A code is bits 30..15 of the demand as an `f32`: its 8 exponent bits and the top 8 bits of
//! its mantissa (the sign bit is left out: demands are ≥ 0). A code's value so has 9
//! significant bits, and the codes are in the order of their values (code `c + 1` is the next
//! value after code `c`'s). [`code`] rounds to the nearest code's value (ties away from zero)
//! and saturates at [`MAX`]; from [`MIN_NORMAL`] to [`MAX`] the relative error is at most
//! 2^-9 ≈ 0.2% (below [`MIN_NORMAL`], where values are a multiple of 2^-134, the absolute
//! error is at most 2^-135).
//!
//! Why: at 11 M map units a round's demands as `f64`s are 88 MB of every stored map version,
//! and forecasts change every unit every round (nearly random low bits, which no compressor
//! takes away). A forecast's own error is several percent; rounding it to 0.2% changes nothing
//! of the map's quality, and the stored demand is still exactly the one the round was solved
//! with (the code's value *is* the demand), so a restart reads back the very instance that
//! was solved. The estimator rounds up, not to nearest: a forecast rounded down would let a
//! map fill a node to its capacity with up to 0.2% more real demand than it planned for
//! (`ops/tests/replay.rs` counts exactly that: with a steady demand, forecast exactly, no node
//! may go over after the warm-up).

/// The largest code of a demand: exponent 254, mantissa all ones. Codes above it are the
/// `f32` bits of infinity and NaN: no demand has them.
pub const MAX_CODE: u16 = 0xFEFF;

/// The largest demand a code holds ([`MAX_CODE`]'s value, `511 · 2^119 ≈ 3.4e38`): a larger
/// one saturates to it.
pub const MAX: f64 = f32::from_bits((MAX_CODE as u32) << 15) as f64;

/// The smallest normal value (2^-126, code `0x0100`): from here up the relative error is at
/// most 2^-9.
pub const MIN_NORMAL: f64 = f32::MIN_POSITIVE as f64;

/// 2^134: below [`MIN_NORMAL`] code `c` (< 256) holds `c · 2^-134`.
const SUBNORMAL_SCALE: f64 = f64::from_bits((1023 + 134) << 52);

/// The code of the value nearest `x` (ties away from zero); `x` beyond [`MAX`] (infinity
/// included) saturates to [`MAX_CODE`]. Zero, a negative `x` and NaN (none of them a demand
/// to round) give code 0, the code of zero.
pub fn code(x: f64) -> u16 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    if x >= MAX {
        return MAX_CODE;
    }
    if x < MIN_NORMAL {
        // At most 256, which is the code of MIN_NORMAL: the codes go on seamlessly.
        return (x * SUBNORMAL_SCALE).round() as u16;
    }
    // The f64's 52 mantissa bits rounded to 8 (half an ulp added: a carry moves into the
    // exponent, as rounding up to the next power of two should), then its exponent rebiased
    // from f64's 1023 to f32's 127. x < MAX, so the result is at most MAX_CODE.
    let rounded = (x.to_bits() + (1 << 43)) >> 44;
    (rounded - ((1023 - 127) << 8)) as u16
}

/// The value of code `c` (exact: every code's value is an `f32`). For `c` above [`MAX_CODE`]
/// (no [`code`] gives one) it is infinity or NaN, which no instance takes as a demand.
pub fn decode(c: u16) -> f64 {
    f64::from(f32::from_bits(u32::from(c) << 15))
}

/// `x` as the value of its nearest code. NaN and a negative `x` (not demands: the instance
/// refuses them) are returned as they are.
pub fn round(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        x
    } else {
        decode(code(x))
    }
}

/// `x` as a round's instance takes it: the smallest code value at or above it (at most
/// `2^-8` above, relative, from [`MIN_NORMAL`] to [`MAX`]; [`MAX`] beyond). NaN and a
/// negative `x` are returned as they are.
pub fn round_up(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        return x;
    }
    let c = code(x);
    if decode(c) < x && c < MAX_CODE {
        decode(c + 1)
    } else {
        decode(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every code decodes to a finite value ≥ 0 that codes back to it, in increasing order;
    /// codes above [`MAX_CODE`] are not values.
    #[test]
    fn every_code_decodes_exactly_and_in_order() {
        let mut before = -1.0;
        for c in 0..=MAX_CODE {
            let x = decode(c);
            assert!(x.is_finite() && x >= 0.0, "code {c:#06x}: {x}");
            assert_eq!(code(x), c, "code {c:#06x} ({x})");
            assert_eq!(round(x).to_bits(), x.to_bits(), "code {c:#06x}");
            assert_eq!(round_up(x).to_bits(), x.to_bits(), "code {c:#06x}");
            assert!(x > before, "code {c:#06x} after {before}");
            before = x;
        }
        assert_eq!(decode(MAX_CODE), MAX);
        assert_eq!(decode(0x0100), MIN_NORMAL);
        assert!((MAX_CODE + 1..=u16::MAX).all(|c| !decode(c).is_finite()));
    }

    /// A table of edges: zero and what is not a demand, ties, the carry into the exponent,
    /// saturation, the smallest values.
    #[test]
    fn edges() {
        let step = 2f64.powi(-8); // between 1 and 2, code values are 1 + k/256
        for (x, want) in [
            (0.0, 0.0),
            (-0.0, 0.0),
            (1.0, 1.0),
            (1.0 + step / 2.0, 1.0 + step),  // a tie: away from zero
            (1.0 + step / 2.0 - 1e-12, 1.0), // just below the tie
            (2.0 - step / 4.0, 2.0),         // the carry into the exponent
            (0.01, 0.010009765625),          // the forecasts' floor
            (1e300, MAX),                    // saturates
            (f64::INFINITY, MAX),
            (MIN_NORMAL / 2.0, MIN_NORMAL / 2.0), // below the normal range: exact here
            (1e-300, 0.0),                        // too small for any code but 0
        ] {
            assert_eq!(decode(code(x)), want, "{x}");
        }
        assert_eq!(code(f64::NAN), 0);
        assert_eq!(code(-3.0), 0);
        assert!(round(f64::NAN).is_nan());
        assert_eq!(round(-3.0), -3.0);
        assert!(round_up(f64::NAN).is_nan());
        assert_eq!(round_up(-3.0), -3.0);
        assert_eq!(round_up(1.0 + 1e-12), 1.0 + step);
        assert_eq!(round_up(1e300), MAX);
        assert_eq!(round_up(0.0), 0.0);
    }

    /// The nearest code's value: within 2^-9 of `x` relative (absolute 2^-135 below the
    /// normal range), and no nearer value on either side.
    fn check(x: f64) {
        let c = code(x);
        let y = decode(c);
        if x < MIN_NORMAL {
            assert!((y - x).abs() <= 2f64.powi(-135), "{x} -> {y}");
        } else if x <= MAX {
            assert!((y - x).abs() <= x * 2f64.powi(-9), "{x} -> {y}");
        } else {
            assert_eq!(c, MAX_CODE);
        }
        let up = round_up(x);
        assert_eq!(
            decode(code(up)).to_bits(),
            up.to_bits(),
            "{x}: a code's value"
        );
        if x <= MAX {
            assert!(up >= x, "{x} rounded up to {up}");
            if x >= MIN_NORMAL {
                assert!(up - x <= x * 2f64.powi(-8), "{x} -> {up}");
            }
            let below = code(up).checked_sub(1).map(decode);
            assert!(
                below.is_none_or(|b| b < x),
                "{x}: {up} not the smallest above"
            );
            if c > 0 {
                assert!(
                    (x - decode(c - 1)).abs() >= (x - y).abs(),
                    "{x}: {c} not nearest"
                );
            }
            if c < MAX_CODE {
                assert!(
                    (decode(c + 1) - x).abs() >= (x - y).abs(),
                    "{x}: {c} not nearest"
                );
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(20_000))]

        /// Any finite x ≥ 0, by its bits (every exponent equally likely).
        #[test]
        fn any_value_codes_to_the_nearest(bits in 0u64..0x7ff0_0000_0000_0000) {
            check(f64::from_bits(bits));
        }

        /// Demands as forecasts have them.
        #[test]
        fn a_forecast_codes_to_the_nearest(x in 0.0..1e7f64) {
            check(x);
        }
    }
}
