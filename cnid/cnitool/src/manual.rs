//! What cnitool's man page and bash completion say beyond its clap
//! definitions (`cnitool --generate ...`, see `cnid_cli::generate`).

use cnid_cli::generate::Extras;

/// The extras of `cnitool.1` and of the bash completion.
pub(crate) const EXTRAS: Extras = Extras {
    section: "1",
    sections: &[
        (
            "EXIT STATUS",
            "\
0    success (also --help and --version)
1    failure: the message on stderr (with --json-errors, the CNI error object);
     also a usage error, as the reference cnitool (CNI code 4 in the object)
130  batch up stopped by SIGINT (143: SIGTERM); the partial summary is printed",
        ),
        (
            "FILES",
            "\
/etc/cni/net.d             network configurations (NETCONFPATH)
/opt/cni/bin, /usr/lib/cni plugins (CNI_PATH)
/var/lib/cni/results       cached ADD results, which check and del use (CNI_CACHE_DIR)
/var/lib/cni/locks         a lock per attachment while an operation runs on it
/run/netns                 named network namespaces (ip netns), batch's among them
/run/cnid/cnid.sock        cnid's socket, with --socket or CNID_SOCKET",
        ),
    ],
    bash: BASH,
};

/// Network names where a command takes NETWORK (from `cnitool networks`:
/// NETCONFPATH's, or cnid's with CNID_SOCKET), the named namespaces of
/// /run/netns where add, check and del take the netns; the generated
/// function completes the rest.
const BASH: &str = r#"# Network names (cnitool networks) and /run/netns paths where they go.
_cnitool_networks() {
    local cur=${COMP_WORDS[COMP_CWORD]} w i skip=0
    local -a pos=()
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        if ((skip)); then skip=0; continue; fi
        case $w in
            -i|--ifname|--socket|--prefix|--concurrency|--count) skip=1 ;;
            -*) ;;
            *) pos+=("$w") ;;
        esac
    done
    if [[ $cur != -* ]]; then
        case "${pos[*]}" in
            add|check|del|gc|status|validate|"batch up"|"batch down")
                COMPREPLY=($(compgen -W "$(cnitool networks 2>/dev/null \
                    | awk 'NR == 1 && $1 != "NAME" { exit } NR > 1 && $1 != "unusable:" { print $1 }')" -- "$cur"))
                return 0
                ;;
            "add "*|"check "*|"del "*)
                if ((${#pos[@]} == 2)); then
                    COMPREPLY=($(compgen -W "$(ls -d /run/netns/* 2>/dev/null)" -- "$cur"))
                    return 0
                fi
                ;;
        esac
    fi
    _cnitool "$@"
}
complete -F _cnitool_networks -o bashdefault -o default cnitool
"#;
