# bash completion for blserve                                    -*- shell-script -*-
_blserve() {
    local cur prev i
    cur=${COMP_WORDS[COMP_CWORD]}
    prev=${COMP_WORDS[COMP_CWORD-1]}
    # A value given after '=': bash makes the '=' a word of its own.
    if [[ $cur == = ]]; then cur=; elif [[ $prev == = ]]; then prev=${COMP_WORDS[COMP_CWORD-2]}; fi
    # Flags bundled with an option that takes a value (-vm raw): the value is the next word.
    [[ $prev =~ ^-[^-mancrt]*([mancrt])$ ]] && prev=-${BASH_REMATCH[1]}
    # After COMMAND (the first operand) or --, complete COMMAND's own arguments as files.
    for ((i = 1; i < COMP_CWORD; i++)); do
        case ${COMP_WORDS[i]} in
            --)
                compopt -o filenames 2>/dev/null
                if ((i == COMP_CWORD - 1)); then mapfile -t COMPREPLY < <(compgen -c -- "$cur"); else mapfile -t COMPREPLY < <(compgen -f -- "$cur"); fi
                return ;;
            -m|--mode|-a|--adapter|-n|--name|--service|--char|-c|--reply-code|-r|--reply|--doorbell|--chunk|-t|--handler-timeout|--max-frame|--max-queue|--max-held|--max-buffered|--allow)
                [[ ${COMP_WORDS[i+1]} == = ]] && ((i++))
                ((i++)) ;;
            -[!-]*)
                [[ ${COMP_WORDS[i]} =~ ^-[^-mancrt]*[mancrt]$ ]] && ((i++)) ;;
            -*) ;;
            *) compopt -o filenames 2>/dev/null; mapfile -t COMPREPLY < <(compgen -f -- "$cur"); return ;;
        esac
    done
    case $prev in
        -m|--mode)
            COMPREPLY=($(compgen -W 'frame raw stream' -- "$cur"))
            return ;;
        -c|--reply-code)
            COMPREPLY=($(compgen -W 'auto raw T U I' -- "$cur"))
            return ;;
        -r|--reply)
            COMPREPLY=($(compgen -W 'pull push' -- "$cur"))
            return ;;
        --doorbell)
            COMPREPLY=($(compgen -W 'early ready' -- "$cur"))
            return ;;
        -a|--adapter)
            COMPREPLY=($(compgen -W "$(ls /sys/class/bluetooth 2>/dev/null | grep -v :)" -- "$cur"))
            return ;;
        -n|--name|--service|--char|--chunk|-t|--handler-timeout|--max-frame|--max-queue|--max-held|--max-buffered|--allow)
            return ;;
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W '--mode --adapter --name --service --char --nus --write-without-response
            --reply-code --reply --doorbell --chunk --eom --handler-timeout --prestart --max-frame --max-queue --max-held --max-buffered --allow --secure
            --verbose --help --version -m -a -n -c -r -t -v -h' -- "$cur"))
    else
        compopt -o filenames 2>/dev/null
        mapfile -t COMPREPLY < <(compgen -c -- "$cur")
    fi
}
complete -F _blserve blserve
