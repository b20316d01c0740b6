//! The thundering-herd simulator: what a retry policy does to a PSP when many clients fail at once
