//! GPT-2's reversible byte ↔ printable-character mapping used by byte-level BPE vocabularies.
//!
//! Bytes that are printable Latin-1 (`!`..`~`, `¡`..`¬`, `®`..`ÿ`) map to themselves; the other
//! 68 bytes map, in byte order, to U+0100, U+0101, … (so space becomes `Ġ`, newline `Ċ`).

/// The character each byte is written as.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        let c = if printable {
            b
        } else {
            let c = next;
            next += 1;
            c
        };
        table[b as usize] = char::from_u32(c).unwrap_or('\u{FFFD}');
    }
    table
}

/// Inverse of [`byte_to_char_table`], as a lookup from character to byte.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let c = c as u32;
    let printable =
        (0x21..=0x7E).contains(&c) || (0xA1..=0xAC).contains(&c) || (0xAE..=0xFF).contains(&c);
    if printable {
        return Some(c as u8);
    }
    if !(256..256 + 68).contains(&c) {
        return None;
    }
    // The k-th non-printable byte (in byte order) maps to 256 + k.
    let k = c - 256;
    let mut seen = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
        if !printable {
            if seen == k {
                return Some(b as u8);
            }
            seen += 1;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_every_byte() {
        let t = byte_to_char_table();
        for b in 0..=255u8 {
            assert_eq!(char_to_byte(t[b as usize]), Some(b));
        }
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
    }
}
