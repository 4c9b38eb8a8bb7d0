//! LSB-first bit packing of `bits`-wide codes.
//!
//! Code `i` of a group occupies bits `[i·bits, (i+1)·bits)` of the group's code area, where bit
//! `k` of the area is bit `k mod 8` of byte `k / 8`. A code may straddle two bytes (3, 5, 6 and
//! 7-bit widths). Group sizes are multiples of 8, so every code area ends on a byte boundary.

/// Appends `codes` (each `< 2^bits`) packed LSB-first. `codes.len() · bits` must be a multiple of 8.
pub(crate) fn pack(codes: &[u8], bits: u32, out: &mut Vec<u8>) {
    debug_assert!((codes.len() * bits as usize).is_multiple_of(8));
    match bits {
        8 => out.extend_from_slice(codes),
        4 => out.extend(codes.chunks_exact(2).map(|c| c[0] | (c[1] << 4))),
        2 => out.extend(
            codes
                .chunks_exact(4)
                .map(|c| c[0] | (c[1] << 2) | (c[2] << 4) | (c[3] << 6)),
        ),
        _ => {
            let mut acc: u32 = 0;
            let mut n: u32 = 0;
            for &c in codes {
                acc |= u32::from(c) << n;
                n += bits;
                while n >= 8 {
                    out.push(acc as u8);
                    acc >>= 8;
                    n -= 8;
                }
            }
        }
    }
}

/// Unpacks `codes.len()` codes from `bytes` (which holds exactly `codes.len() · bits / 8` bytes).
pub(crate) fn unpack(bytes: &[u8], bits: u32, codes: &mut [u8]) {
    debug_assert_eq!(bytes.len() * 8, codes.len() * bits as usize);
    match bits {
        8 => codes.copy_from_slice(bytes),
        4 => {
            for (pair, &b) in codes.chunks_exact_mut(2).zip(bytes) {
                pair[0] = b & 0x0f;
                pair[1] = b >> 4;
            }
        }
        2 => {
            for (quad, &b) in codes.chunks_exact_mut(4).zip(bytes) {
                quad[0] = b & 3;
                quad[1] = (b >> 2) & 3;
                quad[2] = (b >> 4) & 3;
                quad[3] = b >> 6;
            }
        }
        _ => {
            let mask: u32 = (1 << bits) - 1;
            let mut acc: u32 = 0;
            let mut n: u32 = 0;
            let mut it = bytes.iter();
            for c in codes.iter_mut() {
                while n < bits {
                    // Lengths agree (debug-asserted above), so the iterator never runs dry here.
                    acc |= u32::from(it.next().copied().unwrap_or(0)) << n;
                    n += 8;
                }
                *c = (acc & mask) as u8;
                acc >>= bits;
                n -= bits;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_width() {
        for bits in 2..=8u32 {
            let codes: Vec<u8> = (0..64u32)
                .map(|i| ((i * 37 + 5) % (1 << bits)) as u8)
                .collect();
            let mut bytes = Vec::new();
            pack(&codes, bits, &mut bytes);
            assert_eq!(bytes.len(), 64 * bits as usize / 8);
            let mut back = vec![0u8; 64];
            unpack(&bytes, bits, &mut back);
            assert_eq!(back, codes, "bits {bits}");
        }
    }

    #[test]
    fn three_bit_codes_straddle_lsb_first() {
        // codes 1..=8 (masked to 3 bits: 1,2,3,4,5,6,7,0) → bit stream LSB-first.
        let codes = [1u8, 2, 3, 4, 5, 6, 7, 0];
        let mut bytes = Vec::new();
        pack(&codes, 3, &mut bytes);
        // bits: 001 010 011 100 101 110 111 000 written LSB-first:
        // byte0 = c0 | c1<<3 | (c2&3)<<6 = 1 | 16 | 192 = 0xD1
        assert_eq!(bytes, vec![0xD1, 0x58, 0x1F]);
    }
}
