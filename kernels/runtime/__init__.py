"""What every launcher stands on: device arrays and their checks, the driver-level launch path, the device
and its peaks, offline PTX."""
