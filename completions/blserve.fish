# fish completion for blserve
# Where the words before the cursor end: "options" while they are options and their values,
# "value" when the last one is an option that takes a value, "command" right after `--`,
# "arguments" once COMMAND was given (blserve reads no options after it: what follows is
# COMMAND's own, completed as files).
function __blserve_part
    set -l words (commandline -opc)
    set -e words[1]
    set -l with_value -m --mode -a --adapter -n --name --service --char -c --reply-code -r --reply \
        --doorbell --chunk -t --handler-timeout --max-frame --max-queue --max-held --max-buffered --allow
    set -l skip 0
    set -l part options
    for w in $words
        if test $part = command
            echo arguments
            return
        else if test $skip = 1
            set skip 0
        else if test "$w" = --
            set part command
        else if contains -- $w $with_value
            set skip 1
        else if string match -qr -- '^-[^-mancrt]*[mancrt]$' $w
            # flags bundled with an option whose value is the next word (-vm raw)
            set skip 1
        else if not string match -q -- '-*' $w
            echo arguments
            return
        end
    end
    if test $skip = 1
        echo value
    else
        echo $part
    end
end
function __blserve_in_options
    contains -- (__blserve_part) options value
end
# COMMAND: in the options, as a word not starting with "-", or right after `--`.
function __blserve_wants_command
    switch (__blserve_part)
        case command
            return 0
        case options
            not string match -q -- '-*' (commandline -ct)
        case '*'
            return 1
    end
end
complete -c blserve -n __blserve_in_options -s m -l mode -x -a 'frame raw stream' -d 'Frame, raw or stream mode'
complete -c blserve -n __blserve_in_options -s a -l adapter -x -a '(ls /sys/class/bluetooth 2>/dev/null | string match -v "*:*")' -d 'Use this adapter'
complete -c blserve -n __blserve_in_options -s n -l name -x -d 'Advertised name'
complete -c blserve -n __blserve_in_options -l service -x -d 'Service UUID'
complete -c blserve -n __blserve_in_options -l char -x -d 'Characteristic UUID'
complete -c blserve -n __blserve_in_options -l nus -d 'Nordic UART layout'
complete -c blserve -n __blserve_in_options -l write-without-response -d 'Also accept write commands'
complete -c blserve -n __blserve_in_options -s c -l reply-code -x -a 'auto raw T U I' -d 'Frame mode: code of the reply'
complete -c blserve -n __blserve_in_options -s r -l reply -x -a 'pull push' -d 'Frame mode: pull or push replies'
complete -c blserve -n __blserve_in_options -l doorbell -x -a 'early ready' -d 'Frame mode, pull: ring N0000000 as a request starts or once its reply is queued'
complete -c blserve -n __blserve_in_options -l chunk -x -d 'Notify at most N bytes at a time'
complete -c blserve -n __blserve_in_options -l eom -d 'Notify EOM when a run of COMMAND ends'
complete -c blserve -n __blserve_in_options -s t -l handler-timeout -x -d 'Frame mode: seconds before COMMAND is killed'
complete -c blserve -n __blserve_in_options -l prestart -d 'Frame mode: start COMMAND before its request comes'
complete -c blserve -n __blserve_in_options -l max-frame -x -d 'Frame mode: largest frame body accepted'
complete -c blserve -n __blserve_in_options -l max-queue -x -d 'Frame mode: requests and replies outstanding per central'
complete -c blserve -n __blserve_in_options -l max-held -x -d 'Frame mode: unsent reply bytes per central before its next request waits'
complete -c blserve -n __blserve_in_options -l max-buffered -x -d 'Frame mode: bytes held for all centrals before new frames are refused'
complete -c blserve -n __blserve_in_options -l allow -x -d 'Only this central may read and write'
complete -c blserve -n __blserve_in_options -l secure -d 'Require an encrypted link'
complete -c blserve -n __blserve_in_options -s v -l verbose -d 'Log one line per request'
complete -c blserve -n __blserve_in_options -s h -l help -d 'Show help and exit'
complete -c blserve -n __blserve_in_options -l version -d 'Show the version and exit'
complete -c blserve -n __blserve_wants_command -a '(__fish_complete_command)' -d 'Command'
