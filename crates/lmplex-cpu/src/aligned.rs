//! Storage for the kernels' operands that starts on a cache line.
//!
//! Invariant: an `Aligned<T>`'s values start at an address that is a multiple of 64, so a
//! kernel's 64-byte vector or tile row loads at multiples of 64 bytes from the start never
//! straddle two lines. The system allocator gives large `Vec`s 16 bytes past a page, which
//! makes every such load a split load: AMX tile loads of a weight panel ran at about half
//! speed there (measured on Sapphire Rapids).

use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

/// One cache line of storage.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// A number type whose every bit pattern, all zeros included, is a value.
///
/// # Safety
/// Implement it only for types with no padding and no invalid bit patterns, at most 64 bytes
/// in size and alignment.
pub unsafe trait Plain: Copy + 'static {}
// SAFETY: plain numbers: no padding, every bit pattern valid, small.
unsafe impl Plain for f32 {}
// SAFETY: as above.
unsafe impl Plain for u16 {}

/// A growable array of `T` whose first value sits on a cache line (module docs).
#[derive(Clone)]
pub struct Aligned<T: Plain> {
    lines: Vec<Line>,
    len: usize,
    _values: PhantomData<T>,
}

impl<T: Plain> Default for Aligned<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Plain> Aligned<T> {
    /// Values per line.
    const PER_LINE: usize = 64 / std::mem::size_of::<T>();

    /// An empty array (no allocation).
    pub const fn new() -> Self {
        Self { lines: Vec::new(), len: 0, _values: PhantomData }
    }

    /// `len` values, every one with all bits zero (0.0 for f32).
    pub fn zeroed(len: usize) -> Self {
        let mut v = Self::new();
        v.resize_zeroed(len);
        v
    }

    /// Sets the length to `len`: values kept up to it, new ones with all bits zero.
    pub fn resize_zeroed(&mut self, len: usize) {
        let lines = len.div_ceil(Self::PER_LINE);
        // Values past `len` in a kept line are zeroed, so growing later shows zeros there too.
        if len < self.len {
            let end = (lines * Self::PER_LINE).min(self.len);
            // SAFETY: `len..end` is inside the lines; all-zero bits are a `T` (`Plain`).
            unsafe { std::ptr::write_bytes(self.lines.as_mut_ptr().cast::<T>().add(len), 0, end - len) };
        }
        self.lines.resize(lines, Line([0; 64]));
        self.len = len;
    }
}

impl<T: Plain> Aligned<T> {
    /// Length 0, the storage kept.
    pub fn clear(&mut self) {
        self.lines.clear();
        self.len = 0;
    }

    /// Makes the storage hold at least `len` values (the values and length unchanged).
    pub fn reserve_total(&mut self, len: usize) {
        self.lines.reserve(len.div_ceil(Self::PER_LINE).saturating_sub(self.lines.len()));
    }

    /// The start of the storage: valid for writes of as many values as `reserve_total` made
    /// room for.
    pub fn storage_ptr(&mut self) -> *mut T {
        self.lines.as_mut_ptr().cast()
    }

    /// Sets the length to `len` without writing anything.
    ///
    /// # Safety
    /// `reserve_total` must have made room for `len` values, and each value below `len` must
    /// have been written (through `storage_ptr` or the slice).
    pub unsafe fn set_len(&mut self, len: usize) {
        let lines = len.div_ceil(Self::PER_LINE);
        // SAFETY: the caller's contract: the lines are reserved and the values below `len`
        // written; the rest of the last line is zeroed here (what `resize_zeroed` expects).
        unsafe {
            std::ptr::write_bytes(self.storage_ptr().add(len), 0, lines * Self::PER_LINE - len);
            self.lines.set_len(lines);
        }
        self.len = len;
    }
}

impl<T: Plain> From<&[T]> for Aligned<T> {
    fn from(values: &[T]) -> Self {
        let mut v = Self::zeroed(values.len());
        v.copy_from_slice(values);
        v
    }
}

impl<T: Plain> Deref for Aligned<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: the lines hold at least `len` values of `T` (`resize_zeroed`), every bit
        // pattern is a `T` (`Plain`), and a line's alignment (64) is a multiple of `T`'s.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr().cast::<T>(), self.len) }
    }
}

impl<T: Plain> DerefMut for Aligned<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr().cast::<T>(), self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::Aligned;

    #[test]
    fn starts_on_a_line_and_keeps_values() {
        let mut v = Aligned::<u16>::from(&[1u16, 2, 3][..]);
        assert_eq!(v.as_ptr() as usize % 64, 0);
        assert_eq!(&v[..], &[1, 2, 3]);
        v.resize_zeroed(100);
        assert_eq!((v[2], v[3], v[99], v.len()), (3, 0, 0, 100));
        v.resize_zeroed(1);
        v.resize_zeroed(5);
        assert_eq!(&v[..], &[1, 0, 0, 0, 0], "shrinking then growing shows zeros");
        let f = Aligned::<f32>::zeroed(1 << 20);
        assert_eq!(f.as_ptr() as usize % 64, 0);
        assert!(f.iter().all(|&x| x == 0.0));
    }
}
