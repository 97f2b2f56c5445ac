//! MSI-X table and Pending Bit Array (PCI Local Bus 3.0 §6.8.2), for a device
//! that emulates them itself. (QEMU emulates the table on its side and only
//! forwards PBA reads; our in-process client does not, so the device keeps
//! this model in BAR0.)

/// Bytes per table entry.
pub const MSIX_ENTRY_SIZE: u64 = 16;
/// Vector Control bit 0: the vector is masked.
const VECTOR_CTRL_MASKED: u32 = 1;

/// One table entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MsixEntry {
    pub address: u64,
    pub data: u32,
    pub masked: bool,
}

impl Default for MsixEntry {
    /// After reset every vector is masked (§6.8.2.9).
    fn default() -> Self {
        Self {
            address: 0,
            data: 0,
            masked: true,
        }
    }
}

/// The table and the PBA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MsixTable {
    entries: Vec<MsixEntry>,
    pending: Vec<u64>,
}

impl MsixTable {
    /// `vectors` entries, all masked, none pending.
    pub fn new(vectors: u16) -> Self {
        let n = usize::from(vectors);
        Self {
            entries: vec![MsixEntry::default(); n],
            pending: vec![0; n.div_ceil(64)],
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Size of the table in bytes.
    pub fn table_size(&self) -> u64 {
        self.entries.len() as u64 * MSIX_ENTRY_SIZE
    }

    /// Size of the PBA in bytes (whole qwords).
    pub fn pba_size(&self) -> u64 {
        self.pending.len() as u64 * 8
    }

    pub fn reset(&mut self) {
        self.entries
            .iter_mut()
            .for_each(|e| *e = MsixEntry::default());
        self.pending.iter_mut().for_each(|p| *p = 0);
    }

    pub fn entry(&self, vector: u16) -> Option<MsixEntry> {
        self.entries.get(usize::from(vector)).copied()
    }

    /// Guest read of the table at `offset` (from the table start). Accesses
    /// must be 4 or 8 bytes, naturally aligned (§6.8.2); others read as 0.
    pub fn table_read(&self, offset: u64, buf: &mut [u8]) {
        buf.fill(0);
        if !aligned_access(offset, buf.len()) {
            return;
        }
        for (i, chunk) in buf.chunks_mut(4).enumerate() {
            if let Some(v) = self.table_dword(offset + 4 * i as u64) {
                chunk.copy_from_slice(&v.to_le_bytes()[..chunk.len()]);
            }
        }
    }

    /// Guest write of the table; misaligned or odd-sized writes are ignored.
    pub fn table_write(&mut self, offset: u64, data: &[u8]) {
        if !aligned_access(offset, data.len()) {
            return;
        }
        for (i, chunk) in data.chunks(4).enumerate() {
            let mut v = [0u8; 4];
            v[..chunk.len()].copy_from_slice(chunk);
            self.set_table_dword(offset + 4 * i as u64, u32::from_le_bytes(v));
        }
    }

    fn table_dword(&self, offset: u64) -> Option<u32> {
        let e = self
            .entries
            .get(usize::try_from(offset / MSIX_ENTRY_SIZE).ok()?)?;
        Some(match offset % MSIX_ENTRY_SIZE {
            0 => e.address as u32,
            4 => (e.address >> 32) as u32,
            8 => e.data,
            _ => u32::from(e.masked) * VECTOR_CTRL_MASKED,
        })
    }

    fn set_table_dword(&mut self, offset: u64, v: u32) {
        let Some(e) = usize::try_from(offset / MSIX_ENTRY_SIZE)
            .ok()
            .and_then(|i| self.entries.get_mut(i))
        else {
            return;
        };
        match offset % MSIX_ENTRY_SIZE {
            // Message Address is dword aligned: bits 1:0 are read-only 0.
            0 => e.address = (e.address & !0xffff_ffff) | u64::from(v & !3),
            4 => e.address = (e.address & 0xffff_ffff) | (u64::from(v) << 32),
            8 => e.data = v,
            _ => e.masked = v & VECTOR_CTRL_MASKED != 0,
        }
    }

    /// Guest read of the PBA at `offset` (from the PBA start); read-only.
    pub fn pba_read(&self, offset: u64, buf: &mut [u8]) {
        buf.fill(0);
        if !aligned_access(offset, buf.len()) {
            return;
        }
        for (i, b) in buf.iter_mut().enumerate() {
            let byte = offset + i as u64;
            if let Some(q) = usize::try_from(byte / 8)
                .ok()
                .and_then(|q| self.pending.get(q))
            {
                *b = (q >> ((byte % 8) * 8)) as u8;
            }
        }
    }

    pub fn is_pending(&self, vector: u16) -> bool {
        let v = usize::from(vector);
        self.pending
            .get(v / 64)
            .is_some_and(|q| q & (1 << (v % 64)) != 0)
    }

    pub fn set_pending(&mut self, vector: u16, pending: bool) {
        let v = usize::from(vector);
        if let Some(q) = self.pending.get_mut(v / 64) {
            if pending {
                *q |= 1 << (v % 64);
            } else {
                *q &= !(1 << (v % 64));
            }
        }
    }

    /// The device wants to signal `vector`: returns the message to send, or
    /// records it pending when the vector or the function is masked.
    pub fn signal(&mut self, vector: u16, function_masked: bool) -> Option<MsixEntry> {
        let e = self.entry(vector)?;
        if e.masked || function_masked {
            self.set_pending(vector, true);
            return None;
        }
        Some(e)
    }

    /// After an unmask: the pending vectors that may now be delivered, their
    /// pending bits cleared (§6.8.2.9).
    pub fn take_deliverable(&mut self, function_masked: bool) -> Vec<(u16, MsixEntry)> {
        if function_masked {
            return Vec::new();
        }
        let mut out = Vec::new();
        for v in 0..self.entries.len() {
            let vector = v as u16;
            if self.is_pending(vector) && !self.entries[v].masked {
                self.set_pending(vector, false);
                out.push((vector, self.entries[v]));
            }
        }
        out
    }
}

fn aligned_access(offset: u64, len: usize) -> bool {
    matches!(len, 4 | 8) && offset & (len as u64 - 1) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_start_masked_and_table_round_trips() {
        let mut t = MsixTable::new(3);
        assert!(t.entry(2).unwrap().masked);
        t.table_write(16, &0xfee0_0003u32.to_le_bytes());
        t.table_write(20, &1u32.to_le_bytes());
        t.table_write(24, &0x41u32.to_le_bytes());
        t.table_write(28, &0u32.to_le_bytes());
        assert_eq!(
            t.entry(1).unwrap(),
            MsixEntry {
                address: 0x1_fee0_0000,
                data: 0x41,
                masked: false
            }
        );
        let mut b = [0u8; 8];
        t.table_read(16, &mut b);
        assert_eq!(u64::from_le_bytes(b), 0x1_fee0_0000);
        // Misaligned / odd sizes and out of range are ignored.
        t.table_write(17, &[0xff; 4]);
        t.table_write(16, &[0xff; 2]);
        t.table_write(48, &[0xff; 4]);
        assert_eq!(t.entry(1).unwrap().address, 0x1_fee0_0000);
        let mut b = [0xaa; 4];
        t.table_read(48, &mut b);
        assert_eq!(b, [0; 4]);
    }

    #[test]
    fn masked_vector_becomes_pending_and_is_delivered_on_unmask() {
        let mut t = MsixTable::new(70);
        assert_eq!(t.signal(65, false), None);
        assert!(t.is_pending(65));
        let mut b = [0u8; 8];
        t.pba_read(8, &mut b);
        assert_eq!(u64::from_le_bytes(b), 1 << 1);
        assert!(t.take_deliverable(false).is_empty());
        t.table_write(65 * 16 + 12, &0u32.to_le_bytes());
        assert!(
            t.take_deliverable(true).is_empty(),
            "function mask holds it"
        );
        let d = t.take_deliverable(false);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].0, 65);
        assert!(!t.is_pending(65));
        assert!(t.signal(65, false).is_some());
        assert_eq!(t.signal(200, false), None);
    }
}
