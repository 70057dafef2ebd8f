# bash completion for blscan                                     -*- shell-script -*-
_blscan() {
    local cur prev
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    # A value given after '=': bash makes the '=' a word of its own.
    if [[ $cur == = ]]; then cur=; elif [[ $prev == = ]]; then prev=${COMP_WORDS[COMP_CWORD-2]}; fi
    # After --, every word is an operand (DEV), not an option.
    local i
    for ((i = 1; i < COMP_CWORD; i++)); do [[ ${COMP_WORDS[i]} == -- ]] && return; done
    case $prev in
        -a|--adapter)
            COMPREPLY=($(compgen -W "$(ls /sys/class/bluetooth 2>/dev/null | grep -v :)" -- "$cur"))
            return ;;
        -s|--service|--name|--rssi-min|-t|--timeout)
            return ;;
    esac
    COMPREPLY=($(compgen -W '--adapter --service --name --rssi-min --timeout --json --first --help --version
        -a -s -t -j -1 -h' -- "$cur"))
}
complete -F _blscan blscan
