"""Background controllers: the LISTEN loop, wake, BookingRepair, lifecycle, census, wake edges."""
