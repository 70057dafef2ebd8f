# bash completion for blframe                                    -*- shell-script -*-
_blframe() {
    local cur prev
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    case $prev in
        -c|--code)
            COMPREPLY=($(compgen -W 'T U I N auto' -- "$cur"))
            return ;;
        -i|--images)
            COMPREPLY=($(compgen -d -- "$cur"))
            return ;;
    esac
    COMPREPLY=($(compgen -W '--decode --code --exact --lines --raw --images --json --resync --help --version
        -d -c -e -l -r -i -j -s -h' -- "$cur"))
}
complete -F _blframe blframe
