//! Element types and reduction operators, numbered as in NCCL.

use bytemuck::{Pod, Zeroable};
use half::{bf16, f16};
use std::fmt;
use std::sync::OnceLock;

/// The element types of NCCL, with NCCL's numbering (`ncclDataType_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DataType {
    /// `i8`
    Int8 = 0,
    /// `u8`
    Uint8 = 1,
    /// `i32`
    Int32 = 2,
    /// `u32`
    Uint32 = 3,
    /// `i64`
    Int64 = 4,
    /// `u64`
    Uint64 = 5,
    /// IEEE half precision.
    Float16 = 6,
    /// `f32`
    Float32 = 7,
    /// `f64`
    Float64 = 8,
    /// bfloat16.
    Bfloat16 = 9,
    /// 8-bit float, 4 exponent and 3 mantissa bits, no infinities (OCP E4M3FN).
    Float8E4M3 = 10,
    /// 8-bit float, 5 exponent and 2 mantissa bits (OCP E5M2).
    Float8E5M2 = 11,
}

impl DataType {
    /// Every type, in NCCL order.
    pub const ALL: [DataType; 12] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
        DataType::Float8E4M3,
        DataType::Float8E5M2,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DataType::Int8 | DataType::Uint8 | DataType::Float8E4M3 | DataType::Float8E5M2 => 1,
            DataType::Float16 | DataType::Bfloat16 => 2,
            DataType::Int32 | DataType::Uint32 | DataType::Float32 => 4,
            DataType::Int64 | DataType::Uint64 | DataType::Float64 => 8,
        }
    }

    /// The short name used by nccl-tests and collbench (`float`, `half`, `bfloat16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DataType::Int8 => "int8",
            DataType::Uint8 => "uint8",
            DataType::Int32 => "int32",
            DataType::Uint32 => "uint32",
            DataType::Int64 => "int64",
            DataType::Uint64 => "uint64",
            DataType::Float16 => "half",
            DataType::Float32 => "float",
            DataType::Float64 => "double",
            DataType::Bfloat16 => "bfloat16",
            DataType::Float8E4M3 => "f8e4m3",
            DataType::Float8E5M2 => "f8e5m2",
        }
    }

    /// Parses a name: nccl-tests names and Rust-style aliases (`f32`, `f16`, `bf16`, `i32`...).
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        let alias = match s.as_str() {
            "i8" | "char" => "int8",
            "u8" => "uint8",
            "i32" | "int" => "int32",
            "u32" => "uint32",
            "i64" => "int64",
            "u64" => "uint64",
            "f16" | "float16" => "half",
            "f32" | "float32" => "float",
            "f64" | "float64" => "double",
            "bf16" => "bfloat16",
            "e4m3" | "fp8e4m3" | "float8e4m3" => "f8e4m3",
            "e5m2" | "fp8e5m2" | "float8e5m2" => "f8e5m2",
            other => other,
        };
        Self::ALL.into_iter().find(|d| d.name() == alias)
    }

    /// The inverse of `self as u8` (NCCL's numbering).
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.get(code as usize).copied()
    }

    /// Whether this is a floating-point type.
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::Float16
                | DataType::Float32
                | DataType::Float64
                | DataType::Bfloat16
                | DataType::Float8E4M3
                | DataType::Float8E5M2
        )
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that strata can communicate: plain old data with a NCCL element type.
pub trait Element: Pod {
    /// The NCCL type of this element.
    const DTYPE: DataType;
}

macro_rules! element {
    ($($t:ty => $d:ident),* $(,)?) => { $(impl Element for $t { const DTYPE: DataType = DataType::$d; })* };
}
element!(i8 => Int8, u8 => Uint8, i32 => Int32, u32 => Uint32, i64 => Int64, u64 => Uint64,
    half::f16 => Float16, f32 => Float32, f64 => Float64, half::bf16 => Bfloat16,
    F8E4M3 => Float8E4M3, F8E5M2 => Float8E5M2);

/// An 8-bit float with 4 exponent bits (bias 7) and 3 mantissa bits; no infinities, NaN is
/// `S.1111.111`, largest finite value 448.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(transparent)]
pub struct F8E4M3(pub u8);

/// An 8-bit float with 5 exponent bits (bias 15) and 2 mantissa bits, IEEE-like with
/// infinities; largest finite value 57344.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Pod, Zeroable)]
#[repr(transparent)]
pub struct F8E5M2(pub u8);

/// Bit layout of an 8-bit float format.
#[derive(Clone, Copy)]
pub(crate) struct Fp8Format {
    mant_bits: u32,
    bias: i32,
    /// Largest finite code (positive).
    max_code: u8,
    nan_code: u8,
    has_inf: bool,
}

pub(crate) const E4M3: Fp8Format = Fp8Format {
    mant_bits: 3,
    bias: 7,
    max_code: 0x7E,
    nan_code: 0x7F,
    has_inf: false,
};
pub(crate) const E5M2: Fp8Format = Fp8Format {
    mant_bits: 2,
    bias: 15,
    max_code: 0x7B,
    nan_code: 0x7F,
    has_inf: true,
};

impl Fp8Format {
    /// Exact value of a code.
    pub(crate) fn decode(self, code: u8) -> f32 {
        let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
        let mag = code & 0x7F;
        let exp = (mag >> self.mant_bits) as i32;
        let man = (mag & ((1 << self.mant_bits) - 1)) as f32;
        let exp_max: i32 = 0x7F >> self.mant_bits;
        if mag > self.max_code {
            if self.has_inf && mag == (exp_max << self.mant_bits) as u8 {
                return sign * f32::INFINITY;
            }
            return f32::NAN;
        }
        let scale = (1u32 << self.mant_bits) as f32;
        if exp == 0 {
            sign * man / scale * 2f32.powi(1 - self.bias)
        } else {
            sign * (1.0 + man / scale) * 2f32.powi(exp - self.bias)
        }
    }

    /// Rounds to nearest even, saturating to the largest finite value (CUDA's satfinite).
    pub(crate) fn encode(self, x: f32) -> u8 {
        if x.is_nan() {
            return self.nan_code;
        }
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        let a = x.abs();
        let emin = 1 - self.bias; // smallest normal exponent
        let code: u32 = if a < 2f32.powi(emin) {
            // Subnormal (or zero) in the target: scale so that one quantum is 1 and round.
            (a * 2f32.powi(self.mant_bits as i32 - emin)).round_ties_even() as u32
        } else {
            let bits = a.to_bits();
            let shift = 23 - self.mant_bits;
            let round = ((1u32 << (shift - 1)) - 1) + ((bits >> shift) & 1);
            let r = bits.saturating_add(round) >> shift;
            r.saturating_sub(((127 - self.bias) as u32) << self.mant_bits)
        };
        sign | code.min(self.max_code as u32) as u8
    }
}

impl F8E4M3 {
    /// Converts from f32, rounding to nearest even and saturating.
    pub fn from_f32(x: f32) -> Self {
        Self(E4M3.encode(x))
    }
    /// The exact value as f32.
    pub fn to_f32(self) -> f32 {
        fp8_table(E4M3_ID)[self.0 as usize]
    }
}

impl F8E5M2 {
    /// Converts from f32, rounding to nearest even and saturating.
    pub fn from_f32(x: f32) -> Self {
        Self(E5M2.encode(x))
    }
    /// The exact value as f32.
    pub fn to_f32(self) -> f32 {
        fp8_table(E5M2_ID)[self.0 as usize]
    }
}

/// The decode tables of the two fp8 formats.
pub(crate) fn fp8_table(id: usize) -> &'static [f32; 256] {
    static TABLES: OnceLock<[[f32; 256]; 2]> = OnceLock::new();
    &TABLES.get_or_init(|| {
        let mut t = [[0f32; 256]; 2];
        for (id, fmt) in [(E4M3_ID, E4M3), (E5M2_ID, E5M2)] {
            for (c, v) in (0u8..=255).zip(t[id].iter_mut()) {
                *v = fmt.decode(c);
            }
        }
        t
    })[id]
}

/// A scalar of `dtype` holding `v` (rounded or truncated as the type requires).
pub fn scalar_from_f64(dtype: DataType, v: f64) -> Scalar {
    match dtype {
        DataType::Int8 => Scalar::new(v as i8),
        DataType::Uint8 => Scalar::new(v as u8),
        DataType::Int32 => Scalar::new(v as i32),
        DataType::Uint32 => Scalar::new(v as u32),
        DataType::Int64 => Scalar::new(v as i64),
        DataType::Uint64 => Scalar::new(v as u64),
        DataType::Float16 => Scalar::new(f16::from_f64(v)),
        DataType::Float32 => Scalar::new(v as f32),
        DataType::Float64 => Scalar::new(v),
        DataType::Bfloat16 => Scalar::new(bf16::from_f64(v)),
        DataType::Float8E4M3 => Scalar::new(F8E4M3::from_f32(v as f32)),
        DataType::Float8E5M2 => Scalar::new(F8E5M2::from_f32(v as f32)),
    }
}

pub(crate) const E4M3_ID: usize = 0;
pub(crate) const E5M2_ID: usize = 1;

/// A scalar of a given element type, for `PreMulSum`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Scalar {
    /// The type of the value.
    pub dtype: DataType,
    /// The value's bytes (first `dtype.size()` are significant).
    pub bytes: [u8; 8],
}

impl Scalar {
    /// Wraps a value of an element type.
    pub fn new<T: Element>(value: T) -> Self {
        let mut bytes = [0u8; 8];
        bytes[..T::DTYPE.size()].copy_from_slice(bytemuck::bytes_of(&value));
        Self {
            dtype: T::DTYPE,
            bytes,
        }
    }

    /// The significant bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.dtype.size()]
    }
}

/// A reduction operator (`ncclRedOp_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum (wrapping for integers).
    Sum,
    /// Product (wrapping for integers).
    Prod,
    /// Minimum.
    Min,
    /// Maximum.
    Max,
    /// Sum divided by the number of ranks (truncating for integers).
    Avg,
    /// Each rank's input is multiplied by its scalar, then summed. Scalars may differ by rank.
    PreMulSum(Scalar),
}

impl ReduceOp {
    /// The operators without arguments, in NCCL order.
    pub const BASIC: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// NCCL's numbering; every pre-multiplied sum reports 5.
    pub fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Prod => 1,
            ReduceOp::Min => 2,
            ReduceOp::Max => 3,
            ReduceOp::Avg => 4,
            ReduceOp::PreMulSum(_) => 5,
        }
    }

    /// The nccl-tests name.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
            ReduceOp::PreMulSum(_) => "premulsum",
        }
    }

    /// Parses `sum`, `prod`, `min`, `max`, `avg`; `premulsum` takes the scalar 1.
    pub fn parse(s: &str, dtype: DataType) -> Option<Self> {
        let s = s.trim().to_ascii_lowercase();
        if s == "premulsum" || s == "mulsum" {
            return Some(ReduceOp::PreMulSum(scalar_from_f64(dtype, 1.0)));
        }
        Self::BASIC.into_iter().find(|o| o.name() == s)
    }

    /// A name for error messages, from a wire code.
    pub(crate) fn name_of_code(code: u8) -> &'static str {
        ["sum", "prod", "min", "max", "avg", "premulsum"]
            .get(code as usize)
            .copied()
            .unwrap_or("?")
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_round_trips_every_code() {
        for fmt in [E4M3, E5M2] {
            for code in 0..=255u8 {
                let v = fmt.decode(code);
                if v.is_nan() {
                    continue;
                }
                if v.is_infinite() {
                    // satfinite: infinities clamp to the largest finite value
                    assert_eq!(fmt.encode(v) & 0x7F, fmt.max_code);
                    continue;
                }
                let back = fmt.encode(v);
                assert!(
                    back == code || (v == 0.0 && back & 0x7F == 0),
                    "code {code:#x} -> {v} -> {back:#x}"
                );
            }
        }
    }

    #[test]
    fn fp8_known_values() {
        assert_eq!(E4M3.decode(0x7E), 448.0);
        assert_eq!(E5M2.decode(0x7B), 57344.0);
        assert_eq!(F8E4M3::from_f32(1000.0).to_f32(), 448.0);
        assert_eq!(F8E4M3::from_f32(-3.0).to_f32(), -3.0);
        assert_eq!(F8E5M2::from_f32(9.0).to_f32(), 8.0); // ties to even: 9 is between 8 and 10
        assert_eq!(F8E5M2::from_f32(11.0).to_f32(), 12.0);
        assert_eq!(F8E4M3::from_f32(2f32.powi(-9)).to_f32(), 2f32.powi(-9)); // smallest subnormal
        assert_eq!(F8E4M3::from_f32(2f32.powi(-11)).to_f32(), 0.0);
        assert!(F8E4M3(0x7F).to_f32().is_nan());
    }

    #[test]
    fn names_parse_back() {
        for d in DataType::ALL {
            assert_eq!(DataType::parse(d.name()), Some(d));
            assert_eq!(DataType::from_code(d as u8), Some(d));
        }
        assert_eq!(DataType::parse("bf16"), Some(DataType::Bfloat16));
        assert_eq!(
            ReduceOp::parse("max", DataType::Float32),
            Some(ReduceOp::Max)
        );
    }
}
