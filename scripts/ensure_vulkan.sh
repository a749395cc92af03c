#!/usr/bin/env bash
# Make sure a Vulkan loader and at least one driver exist; on Debian/Ubuntu as root, install
# Mesa's (lavapipe runs on any CPU). Prints what to install otherwise.
set -euo pipefail

have_loader() { ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; }
have_driver() {
  [ -n "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ] && return 0
  compgen -G "/usr/share/vulkan/icd.d/*.json" >/dev/null || compgen -G "/etc/vulkan/icd.d/*.json" >/dev/null \
    || compgen -G "/usr/local/share/vulkan/icd.d/*.json" >/dev/null
}

if have_loader && have_driver; then
  exit 0
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "Installing the Vulkan loader and Mesa drivers (libvulkan1 mesa-vulkan-drivers)..."
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libvulkan1 mesa-vulkan-drivers >/dev/null
  exit 0
fi
echo "No Vulkan loader/driver found. Install them, e.g.: sudo apt-get install -y libvulkan1 mesa-vulkan-drivers" >&2
exit 1
