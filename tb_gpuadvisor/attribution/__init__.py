"""Attribution: every microsecond of a trusted step given one cause, per device."""
