# fish completion for blserve
complete -c blserve -s m -l mode -x -a 'frame raw stream' -d 'Frame, raw or stream mode'
complete -c blserve -s a -l adapter -x -a '(ls /sys/class/bluetooth 2>/dev/null)' -d 'Use this adapter'
complete -c blserve -s n -l name -x -d 'Advertised name'
complete -c blserve -l service -x -d 'Service UUID'
complete -c blserve -l char -x -d 'Characteristic UUID'
complete -c blserve -l nus -d 'Nordic UART layout'
complete -c blserve -l write-without-response -d 'Also accept write commands'
complete -c blserve -s c -l reply-code -x -a 'auto raw T U I' -d 'Frame mode: code of the reply'
complete -c blserve -s r -l reply -x -a 'pull push' -d 'Frame mode: pull or push replies'
complete -c blserve -l chunk -x -d 'Notify at most N bytes at a time'
complete -c blserve -l eom -d 'Notify EOM when the output ends'
complete -c blserve -s t -l handler-timeout -x -d 'Frame mode: seconds before COMMAND is killed'
complete -c blserve -l prestart -d 'Frame mode: start COMMAND before its request comes'
complete -c blserve -l max-frame -x -d 'Largest frame body accepted'
complete -c blserve -l max-queue -x -d 'Requests and replies outstanding per central'
complete -c blserve -l max-held -x -d 'Unsent reply bytes per central before its next request waits'
complete -c blserve -l allow -x -d 'Only this central may read and write'
complete -c blserve -l secure -d 'Require an encrypted link'
complete -c blserve -s v -l verbose -d 'Log one line per request'
complete -c blserve -s h -l help -d 'Show help and exit'
complete -c blserve -l version -d 'Show the version and exit'
# COMMAND: while no word other than options and their values has been given yet.
function __blserve_wants_command
    string match -q -- '-*' (commandline -ct); and return 1
    set -l words (commandline -opc)
    set -e words[1]
    set -l with_value -m --mode -a --adapter -n --name --service --char -c --reply-code -r --reply \
        --chunk -t --handler-timeout --max-frame --max-queue --max-held --allow
    set -l skip 0
    set -l options_end 0
    for w in $words
        if test $options_end = 1
            return 1
        else if test $skip = 1
            set skip 0
        else if test "$w" = --
            set options_end 1
        else if contains -- $w $with_value
            set skip 1
        else if not string match -q -- '-*' $w
            return 1
        end
    end
    return 0
end
complete -c blserve -n '__blserve_wants_command' -a '(__fish_complete_command)' -d 'Command'
