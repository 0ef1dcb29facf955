//! Restart strategies: which siblings restart with a failed child (OTP's `strategy`).

use std::ops::Range;

/// Which children a supervisor restarts when one of them must be restarted.
///
/// Whatever the strategy, the children in the group that are still running are stopped in
/// reverse start order, then the whole group is started again in start order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Only the failed child (OTP `one_for_one`): children are independent.
    #[default]
    OneForOne,
    /// Every child (OTP `one_for_all`): children cannot work without each other.
    OneForAll,
    /// The failed child and every child started after it (OTP `rest_for_one`): later
    /// children depend on earlier ones.
    RestForOne,
}

impl Strategy {
    /// The positions (in start order) restarted when the child at `failed` of `len` must be.
    pub fn group(self, failed: usize, len: usize) -> Range<usize> {
        match self {
            Strategy::OneForOne => failed..failed + 1,
            Strategy::OneForAll => 0..len,
            Strategy::RestForOne => failed..len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Strategy;

    #[test]
    fn groups_follow_otp() {
        assert_eq!(Strategy::OneForOne.group(1, 4), 1..2);
        assert_eq!(Strategy::OneForAll.group(1, 4), 0..4);
        assert_eq!(Strategy::RestForOne.group(1, 4), 1..4);
        assert_eq!(Strategy::RestForOne.group(3, 4), 3..4);
    }
}
