# Sourced by setup.sh, test.sh and bench.sh: the build tags and cgo
# environment for the optional backends this machine can build.
#   ucx:  libucx-dev (Debian) found by pkg-config
#   flux: flux-core found by pkg-config, e.g. under /opt/flux-core as
#         ../shared/flux/install.sh puts it (flux-core is not in Debian)
# Exports DYADFS_TAGS (comma-separated, maybe empty) and, for Flux,
# PKG_CONFIG_PATH, an rpath so the binary finds libflux-core, and PATH.
export PATH="$PATH:/usr/local/go/bin"
if [[ -d /opt/flux-core/lib/pkgconfig ]]; then
	export PKG_CONFIG_PATH="/opt/flux-core/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
	export PATH="/opt/flux-core/bin:$PATH"
fi
DYADFS_TAGS=
if command -v pkg-config >/dev/null; then
	if pkg-config --exists ucx; then
		DYADFS_TAGS=ucx
	fi
	if pkg-config --exists flux-core; then
		DYADFS_TAGS="${DYADFS_TAGS:+$DYADFS_TAGS,}flux"
		export CGO_LDFLAGS="${CGO_LDFLAGS:+$CGO_LDFLAGS }-Wl,-rpath,$(pkg-config --variable=libdir flux-core)"
	fi
fi
export DYADFS_TAGS
