//! Errors from topology sources: which file, which line, what was expected.

use std::fmt;

/// A topology input that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopoError {
    /// The file (or `<input>` for text given directly).
    pub file: String,
    /// 1-based line, 0 when the problem is not tied to a line.
    pub line: u32,
    /// What was expected, or what went wrong.
    pub message: String,
}

impl TopoError {
    /// An error at `line` of `file`.
    pub fn at(file: &str, line: u32, message: impl Into<String>) -> Self {
        Self {
            file: file.to_string(),
            line,
            message: message.into(),
        }
    }
}

impl fmt::Display for TopoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "{}:{}: {}", self.file, self.line, self.message)
        } else {
            write!(f, "{}: {}", self.file, self.message)
        }
    }
}

impl std::error::Error for TopoError {}

/// Largest topology file strata reads; real ones are kilobytes to a few megabytes.
pub const MAX_INPUT_BYTES: usize = 64 << 20;

/// Reads a whole topology file, refusing anything larger than [`MAX_INPUT_BYTES`].
pub fn read_file(path: &std::path::Path) -> Result<String, TopoError> {
    let name = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| TopoError::at(&name, 0, e.to_string()))?;
    if meta.len() > MAX_INPUT_BYTES as u64 {
        return Err(TopoError::at(
            &name,
            0,
            format!("{} bytes; expected at most {MAX_INPUT_BYTES}", meta.len()),
        ));
    }
    std::fs::read_to_string(path).map_err(|e| TopoError::at(&name, 0, e.to_string()))
}
