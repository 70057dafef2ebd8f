# bash completion for blframe                                    -*- shell-script -*-
_blframe() {
    local cur prev
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    # A value given after '=': bash makes the '=' a word of its own.
    if [[ $cur == = ]]; then cur=; elif [[ $prev == = ]]; then prev=${COMP_WORDS[COMP_CWORD-2]}; fi
    # After --, the only operand is standard input, '-'.
    local i
    for ((i = 1; i < COMP_CWORD; i++)); do
        [[ ${COMP_WORDS[i]} == -- ]] && { COMPREPLY=($(compgen -W '-' -- "$cur")); return; }
    done
    case $prev in
        -c|--code)
            COMPREPLY=($(compgen -W 'T U I N auto' -- "$cur"))
            return ;;
        -i|--images)
            compopt -o filenames 2>/dev/null
            mapfile -t COMPREPLY < <(compgen -d -- "$cur")
            return ;;
    esac
    COMPREPLY=($(compgen -W '--decode --code --exact --lines --raw --images --json --resync --help --version
        -d -c -e -l -r -i -j -s -h' -- "$cur"))
}
complete -F _blframe blframe
