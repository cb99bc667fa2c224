# flags.sh: the flag parsing the bench scripts share. A script sets
# FLAG_VARS to the variables its flags set (TOTAL is --total, BIN_DIR is
# --bin-dir; each may also come from the environment) and runs
#
#     source "$(dirname "$0")/flags.sh"; parse_flags "$@"
#
# --help prints the script's header comment and every flag with its value.
# --keep alone sets KEEP=1 in a script whose FLAG_VARS has KEEP.

usage() {
	sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
	echo "Flags (environment variable in brackets, current value after =):"
	local v flag
	for v in $FLAG_VARS; do
		flag=$(echo "$v" | tr 'A-Z_' 'a-z-')
		printf '  --%-16s [%s] = %s\n' "$flag" "$v" "${!v}"
	done
}

parse_flags() {
	local me var
	me=$(basename "$0")
	while [[ $# -gt 0 ]]; do
		case $1 in
		-h | --help) usage; exit 0 ;;
		--keep) # a bare flag, in the scripts that have KEEP
			[[ " $FLAG_VARS " == *" KEEP "* ]] || { echo "$me: unknown flag $1 (see --help)" >&2; exit 2; }
			KEEP=1
			shift
			;;
		--*=*) set -- "${1%%=*}" "${1#*=}" "${@:2}" ;;
		--*)
			[[ $# -ge 2 ]] || { echo "$me: $1 needs a value" >&2; exit 2; }
			var=$(echo "${1#--}" | tr 'a-z-' 'A-Z_')
			case " $FLAG_VARS " in
			*" $var "*) printf -v "$var" '%s' "$2" ;;
			*) echo "$me: unknown flag $1 (see --help)" >&2; exit 2 ;;
			esac
			shift 2
			;;
		*) echo "$me: unexpected argument $1 (see --help)" >&2; exit 2 ;;
		esac
	done
}
