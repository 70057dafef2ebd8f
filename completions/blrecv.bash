# bash completion for blrecv                                     -*- shell-script -*-
_blrecv() {
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
        --service|--char|--scan-timeout|--connect-timeout|-n|--count|-t|--timeout|--buffer)
            return ;;
    esac
    COMPREPLY=($(compgen -W '--adapter --service --char --nus --scan-timeout --connect-timeout --pair --verbose --no-pull --read
        --eom --count --timeout --buffer --help --version -a -v -r -n -t -h' -- "$cur"))
}
complete -F _blrecv blrecv
